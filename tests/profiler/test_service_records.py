"""The profiler service's wire mapping (CompletionRecord -> CallRecord, Annotation -> SysAnnotations),
and the record builders the other service tests share."""

from __future__ import annotations

import numpy as np
import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.profiler import convert
from clairvoyant.profiler.core import Annotation, CallRecord, ProfileConfig, ProfileStore, Tier
from clairvoyant.profiler.core.confidence import ConfidenceConfig
from tests.profiler.generators import listing1, timed_calls

pytestmark = pytest.mark.unit

SERVICE = {"planner": 2.0, "explorer": 5.0, "engineer": 8.0, "reviewer": 3.0, "verifier": 1.0}
EPOCH = 1_700_000_000.0  # the gateway's timing fields are wall-clock seconds


def lengths(agent: str, rng: np.random.Generator) -> int:
    return int(rng.lognormal(np.log(300 if agent != "verifier" else 40), 0.4))


def completion_records(
    tenant: str, workflow_type_id: str, instances: int, *, seed: int = 0, first: int = 0
) -> list[common_pb2.CompletionRecord]:
    """``instances`` runs of Pythia's Listing 1 as the gateway would publish them, instance after
    instance, the last call of each carrying ``workflow_end``; workflow ids ``w<first>``..."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(first, first + instances):
        workflow_id = f"{tenant}-w{i}"
        calls = timed_calls(
            workflow_id, listing1(rng), rng, start=EPOCH + i * 1000.0, service=SERVICE, lengths=lengths
        )
        for j, call in enumerate(calls):
            meta = common_pb2.AppMetadata(
                workflow_type_id=workflow_type_id, workflow_id=workflow_id, agent_id=call.agent_id
            )
            if j == len(calls) - 1:
                meta.workflow_end = True
            records.append(
                common_pb2.CompletionRecord(
                    request_id=call.request_id,
                    tenant=tenant,
                    app_metadata=meta,
                    model="m",
                    prompt_tokens=call.prompt_tokens,
                    output_tokens=call.output_tokens,
                    timing=common_pb2.Timing(arrival_time=call.start, end_time=call.end),
                    status=common_pb2.REQUEST_STATUS_OK,
                )
            )
    return records


def small_config(min_instances: int = 10) -> ProfileConfig:
    """Leaves shadow after ``min_instances`` closed instances, converged or not (the tests'
    workloads are small: Listing 1's once-per-run agents' output lengths converge at 128 runs)."""
    return ProfileConfig(
        resynthesize_every=10,
        confidence=ConfidenceConfig(min_instances=min_instances, high_instances=40, require_convergence=False),
    )


def reference_store(records: list[common_pb2.CompletionRecord], config: ProfileConfig) -> ProfileStore:
    """What the service should learn: every record ingested once, in order, by the core alone."""
    store = ProfileStore(config)
    for msg in records:
        keyed = convert.call_record(msg)
        assert keyed is not None
        store.ingest(*keyed)
    return store


# --- the mapping ----------------------------------------------------------------------------------


def test_completion_record_maps_every_field_the_core_uses() -> None:
    meta = common_pb2.AppMetadata(
        workflow_type_id="coding", workflow_id="w1", agent_id="engineer", upstream_agent_id="planner",
        parent_request_ids=["r0", "r00"], tool="pytest", workflow_version="v2", workflow_end=True,
    )
    msg = common_pb2.CompletionRecord(
        request_id="r1", tenant="acme", app_metadata=meta, prompt_tokens=120, output_tokens=37,
        timing=common_pb2.Timing(arrival_time=100.5, scheduled_time=100.6, first_token_time=101.0, end_time=104.25),
        prompt_block_hashes=[2**64 - 1, 7], response_block_hashes=[7, 9, 11],
    )
    keyed = convert.call_record(msg)
    assert keyed == convert.KeyedRecord(
        "acme",
        "coding",
        CallRecord(
            request_id="r1", workflow_id="w1", agent_id="engineer", start=100.5, end=104.25,
            prompt_tokens=120, output_tokens=37, upstream_agent_id="planner", parent_request_ids=("r0", "r00"),
            tool="pytest", workflow_version="v2", workflow_end=True,
            prompt_blocks=(2**64 - 1, 7), response_blocks=(7, 9, 11),
        ),
    )
    # the model the call ran on feeds the length priors of agents never seen; "" is no model
    msg.model = "coder-14b"
    keyed = convert.call_record(msg)
    assert keyed is not None and keyed.record.model == "coder-14b"
    msg.model = ""
    keyed = convert.call_record(msg)
    assert keyed is not None and keyed.record.model is None


def test_optional_metadata_stays_unset_and_a_missing_end_time_is_instantaneous() -> None:
    meta = common_pb2.AppMetadata(workflow_type_id="t", workflow_id="w", agent_id="a")
    msg = common_pb2.CompletionRecord(request_id="r", tenant="x", app_metadata=meta,
                                      timing=common_pb2.Timing(arrival_time=50.0))
    keyed = convert.call_record(msg)
    assert keyed is not None
    record = keyed.record
    assert (record.start, record.end) == (50.0, 50.0)
    assert (record.upstream_agent_id, record.tool, record.workflow_version, record.workflow_end) == (
        None, None, None, False,
    )


@pytest.mark.parametrize("missing", ["app_metadata", "workflow_type_id", "workflow_id", "agent_id", "request_id"])
def test_records_without_workflow_ids_are_skipped(missing: str) -> None:
    msg = completion_records("acme", "coding", 1)[0]
    if missing == "request_id":
        msg.request_id = ""
    elif missing == "app_metadata":
        msg.ClearField("app_metadata")
    else:
        setattr(msg.app_metadata, missing, "")
    assert convert.call_record(msg) is None


def test_sys_annotations_carry_every_prediction() -> None:
    annotation = Annotation(
        Tier.HIGH, output_len_p50=300.0, output_len_p99=900.0, path_expression="reviewer -> verifier -> $",
        expected_remaining_steps=2.0, expected_remaining_time_s=12.5,
        next_agents=(("reviewer", 0.75), ("engineer", 0.25)), end_probability=0.0, kairos_rank=3,
    )
    out = convert.sys_annotations(annotation)
    assert out.confidence == common_pb2.CONFIDENCE_HIGH
    assert (out.predicted_output_len.p50, out.predicted_output_len.p99) == (300.0, 900.0)
    assert out.predicted_path_regex == "reviewer -> verifier -> $"
    assert (out.expected_remaining_steps, out.expected_remaining_time_s, out.kairos_rank) == (2.0, 12.5, 3.0)
    assert [(a.agent_id, a.probability) for a in out.next_agents] == [("reviewer", 0.75), ("engineer", 0.25)]
    assert out.prompt_composition == ""


def test_empty_annotation_is_confidence_none_with_nothing_set() -> None:
    out = convert.sys_annotations(Annotation.empty())
    assert out.confidence == common_pb2.CONFIDENCE_NONE
    for field in ("predicted_output_len", "expected_remaining_steps", "expected_remaining_time_s", "kairos_rank"):
        assert not out.HasField(field)
    assert (out.predicted_path_regex, len(out.next_agents), out.prompt_composition) == ("", 0, "")


def test_prompt_composition_is_the_next_prompt_template() -> None:
    template = "${engineer[-1]:response:[0,1024]}"
    out = convert.sys_annotations(Annotation(Tier.LOW, next_prompt_template=template))
    assert (out.prompt_composition, out.confidence) == (template, common_pb2.CONFIDENCE_LOW)
