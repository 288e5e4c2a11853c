"""Properties every registered preset keeps, whatever the traffic.

Work conservation: after a dispatch, no live worker of a model sits without a placement while a
call of that model waits in the global queue.  The presets that hold calls back on purpose
(kairos' time slots, pythia's capacity check, clairvoyant's time slots) still place on an empty
worker: their rules admit any call to a worker with nothing placed, so the property holds for all
of them.  Calls here exclude no worker (an excluded idle worker is a deliberate hold).
thunderagent is exempt: it holds calls back while memory is reserved.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit

MODELS = ("m1", "m2")
WORKERS = (("w1", "m1"), ("w2", "m1"), ("w3", "m1"), ("w4", "m2"))
BLOCKS = 64  # x 16 tokens: 1,024 tokens per worker, so a few calls fill one


def _request(index: int, data: st.DataObject) -> QueuedRequest:
    draw = data.draw
    model = draw(st.sampled_from(MODELS))
    workflow = draw(st.integers(0, 5))
    annotations = None
    if draw(st.booleans()):
        annotations = common_pb2.SysAnnotations(
            confidence=draw(st.sampled_from([common_pb2.CONFIDENCE_HIGH, common_pb2.CONFIDENCE_SHADOW])),
            expected_remaining_steps=draw(st.integers(0, 6)),
            kairos_rank=draw(st.integers(0, 3)),
        )
        output = draw(st.integers(1, 600))
        annotations.predicted_output_len.CopyFrom(common_pb2.LengthInterval(p50=output, p99=output * 2))
    return QueuedRequest(
        f"r{index}",
        draw(st.sampled_from(["t1", "t2"])),
        model,
        0.0,
        prompt_tokens=draw(st.integers(1, 1_500)),  # some exceed a worker's whole pool
        max_tokens=draw(st.integers(0, 400)),
        app_metadata=AppMetadata("type", f"wf{workflow}", draw(st.sampled_from(["a", "b", "c"]))),
        annotations=annotations_from_proto(annotations) if annotations is not None else None,
    )


@st.composite
def traffic(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Operations: ("submit", n) submits n new calls; ("complete", k) completes the k-th oldest
    placement; ("beat", k) a heartbeat of worker k reporting its KV as nearly full."""
    ops = st.one_of(
        st.tuples(st.just("submit"), st.integers(1, 6)),
        st.tuples(st.just("complete"), st.integers(0, 20)),
        st.tuples(st.just("beat"), st.integers(0, len(WORKERS) - 1)),
    )
    return draw(st.lists(ops, min_size=1, max_size=30))


def _report(worker_id: str, model: str, used: int) -> WorkerReport:
    return WorkerReport(worker_id, model, "", max_batch=4, kv_blocks_used=used, kv_blocks_total=BLOCKS, block_size=16)


# thunderagent idles a worker on purpose: it reserves memory for programs in tool calls, and a
# paused program's call waits for the next 0.5 s check (docs/scheduling.md, "thunderagent").
NOT_WORK_CONSERVING = frozenset({"thunderagent"})


@pytest.mark.parametrize("preset", [p for p in PRESETS.names() if p not in NOT_WORK_CONSERVING])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_idle_worker_while_a_call_of_its_model_waits(preset: str, data: st.DataObject) -> None:
    scheduler = GlobalScheduler.from_preset(preset, max_queue_per_model=10_000)
    for worker_id, model in WORKERS:
        scheduler.update_worker(_report(worker_id, model, 0), 0.0)
    placed: list[tuple[str, str]] = []  # (request id, worker id), oldest first
    now, submitted = 0.0, 0
    for op, value in data.draw(traffic()):
        now += data.draw(st.sampled_from([0.0, 0.05, 0.3, 2.0]))
        if op == "submit":
            for _ in range(value):
                request = _request(submitted, data)
                submitted += 1
                scheduler.submit(_at(request, now), now)
        elif op == "complete" and placed:
            request_id, worker_id = placed.pop(value % len(placed))
            assert scheduler.complete(request_id, worker_id, now=now, output_tokens=10)
        elif op == "beat":
            worker_id, model = WORKERS[value]
            scheduler.update_worker(_report(worker_id, model, BLOCKS - 1), now)
        placed += [(d.request_id, d.worker.worker_id) for d in scheduler.dispatch(now)]
        scheduler.check_integrity()
        for worker in scheduler.workers():
            if scheduler.queue_depth(worker.model):
                assert worker.placed > 0, f"{preset}: {worker.worker_id} idle while {worker.model} has calls waiting"


def _at(request: QueuedRequest, now: float) -> QueuedRequest:
    """The request as submitted at ``now`` (its arrival time is the submit time)."""
    return QueuedRequest(
        request.request_id, request.tenant, request.model, now, request.prompt_tokens, request.max_tokens,
        request.app_metadata, request.annotations,
    )  # fmt: skip
