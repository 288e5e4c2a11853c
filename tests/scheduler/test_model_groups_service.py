"""Model groups in the scheduler service: the declaration and routers loaded at start-up, the wire
fields (input_text in, the chosen model out, the groups in the Snapshot), the per-(group, model)
counter, and dispatch at the time a model-choosing policy asks to be woken."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from clairvoyant.core.bus import worker_stats_subject
from clairvoyant.core.grpcutil import channel
from clairvoyant.core.model_groups import ModelGroupError, load_model_groups
from clairvoyant.policy import PRIORITY_POLICIES
from clairvoyant.policy.aragog import AragogRouting, AragogSearch
from clairvoyant.policy.aragog.routers import InputClass, TableRouter, ngram_weights
from clairvoyant.policy.types import WorkerView
from clairvoyant.scheduler import convert
from clairvoyant.scheduler.__main__ import EXIT_BAD_MODEL_GROUPS, main
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.scheduler.core import Decision, SchedulerSnapshot
from clairvoyant.scheduler.model_groups import (
    SchedulerPolicies,
    build_scheduler_policies,
    model_choosing_presets,
)

GROUP, SMALL, LARGE = "auto", "m-small", "m-large"
TASK = "Write a Python function to reverse a string."
META = common_pb2.AppMetadata(workflow_type_id="self_refine", workflow_id="wf-1", agent_id="generate")


def write_groups(directory: Path, router: dict[str, object] | None = None) -> Path:
    """A declaration of GROUP = (SMALL, LARGE) with a self_refine space, its table router beside it
    (every configuration accurate for inputs like TASK) unless ``router`` replaces the profile."""
    everything = tuple("+".join(models) for models in itertools.product((SMALL, LARGE), repeat=3))
    table = TableRouter("self_refine", [InputClass("any", everything, ngram_weights(TASK))]).to_dict()
    (directory / "self_refine.json").write_text(json.dumps(router if router is not None else table))
    path = directory / "groups.yaml"
    path.write_text(
        f"groups:\n  {GROUP}:\n    models: [{SMALL}, {LARGE}]\n    workflows:\n      self_refine:\n"
        "        agents: [generate, critique, refine]\n        router: {table: self_refine.json}\n"
    )
    return path


# ---- start-up -----------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_model_choosing_preset_gets_the_groups_and_their_routers(tmp_path: Path) -> None:
    path = write_groups(tmp_path)
    policies = build_scheduler_policies("aragog", path)
    assert isinstance(policies.routing, AragogRouting)
    assert policies.routing.group_models() == {GROUP: frozenset({SMALL, LARGE})}
    assert list(policies.groups.groups) == [GROUP]
    search = policies.routing.strategy
    assert isinstance(search, AragogSearch)
    router = search.routers[(GROUP, "self_refine")]
    space = policies.groups.groups[GROUP].workflows["self_refine"].space
    assert router.predict(space, TASK, range(space.size)) == [True] * 8
    assert router.predict(space, "zzz", [0, space.reference]) == [False, True]  # unknown: c* only


@pytest.mark.unit
def test_every_aragog_preset_starts_with_the_declaration(tmp_path: Path) -> None:
    path = write_groups(tmp_path)
    assert model_choosing_presets() == ["aragog", "aragog-per-input", "aragog-per-workflow"]
    for preset in model_choosing_presets():
        assert build_scheduler_policies(preset, path).routing.group_models() == {GROUP: frozenset({SMALL, LARGE})}


@pytest.mark.unit
def test_no_declaration_changes_nothing() -> None:
    policies = build_scheduler_policies("fcfs-rr")
    assert (type(policies.routing).__name__, bool(policies.groups)) == ("RoundRobinRouting", False)


@pytest.mark.unit
def test_a_preset_that_does_not_choose_models_refuses_groups(tmp_path: Path) -> None:
    path = write_groups(tmp_path)
    with pytest.raises(ModelGroupError) as refused:
        build_scheduler_policies("fcfs-rr", path)
    assert str(refused.value) == (
        f"the scheduler preset 'fcfs-rr' does not choose models, so the model groups of {path} (auto) "
        "could never be served; use one of: aragog, aragog-per-input, aragog-per-workflow"
    )


@pytest.mark.unit
def test_bad_router_profiles_are_named(tmp_path: Path) -> None:
    path = write_groups(tmp_path, router={"kind": "table", "classes": []})
    with pytest.raises(ModelGroupError, match=r"self_refine\.json: not a usable table router profile"):
        build_scheduler_policies("aragog", path)
    (tmp_path / "self_refine.json").write_text("{not json")
    with pytest.raises(ModelGroupError, match="not a usable table router profile"):
        build_scheduler_policies("aragog", path)
    (tmp_path / "self_refine.json").unlink()
    with pytest.raises(ModelGroupError, match=r"cannot read the table router .*self_refine\.json"):
        build_scheduler_policies("aragog", path)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("preset", "groups", "expected"),
    [
        ("aragog", "missing.yaml", "cannot read model groups file"),
        ("aragog", "bad.yaml", "'models' must be ordered cheapest first"),
        ("least-loaded", "good.yaml", "does not choose models"),
    ],
)
def test_start_up_exits_with_code_2_naming_the_problem(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    preset: str,
    groups: str,
    expected: str,
) -> None:
    (tmp_path / "bad.yaml").write_text("groups:\n  g:\n    models: {a: 2, b: 1}\n")
    write_groups(tmp_path).rename(tmp_path / "good.yaml")
    monkeypatch.setenv("CV_MODEL_GROUPS", str(tmp_path / groups))
    monkeypatch.setenv("CV_POLICY", preset)
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == EXIT_BAD_MODEL_GROUPS == 2
    err = capsys.readouterr().err
    assert err.startswith("invalid model groups (CV_MODEL_GROUPS): ") and expected in err


@pytest.mark.unit
def test_an_empty_setting_declares_no_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_MODEL_GROUPS", "")  # docker-compose.yml's default
    assert SchedulerSettings().model_groups is None


# ---- the wire -----------------------------------------------------------------------------------


@pytest.mark.unit
def test_input_text_is_cut_to_the_cap() -> None:
    msg = scheduler_pb2.ScheduleRequest(request_id="r", model=GROUP, input_text="é" * 5000)
    assert convert.queued_request(msg, 1.0).input_text == "é" * convert.INPUT_TEXT_MAX_CHARS == "é" * 4096
    assert convert.queued_request(scheduler_pb2.ScheduleRequest(request_id="r", model=SMALL), 1.0).input_text == ""


@pytest.mark.unit
def test_the_placement_names_its_workers_model_and_the_snapshot_the_groups(tmp_path: Path) -> None:
    groups = load_model_groups(write_groups(tmp_path))
    worker = WorkerView(
        worker_id="w1", model=LARGE, address="10.0.0.1:1", http_address="", running=0, queued=0, placed=1,
        max_batch=4, kv_blocks_used=0, kv_blocks_total=0, max_model_len=0, draining=False,
        last_heartbeat=0.0, heartbeat_interval_s=1.0,
    )  # fmt: skip
    placement = convert.placement(Decision("r1", worker, 0.0, 0.25), "aragog", 30.0)
    assert (placement.model, placement.worker_id, placement.preset) == (LARGE, "w1", "aragog")
    snap = convert.snapshot(SchedulerSnapshot(policy="aragog", taken_at=0.0, queues=(), workers=()), groups)
    assert [(g.name, list(g.models)) for g in snap.groups] == [(GROUP, [SMALL, LARGE])]
    assert not convert.snapshot(SchedulerSnapshot(policy="x", taken_at=0.0, queues=(), workers=())).groups


# ---- the live service ---------------------------------------------------------------------------


async def heartbeat(url: str, interval_s: float) -> None:
    """One report from a worker of each model, saying it beats every ``interval_s``."""
    nc = await nats.connect(url)
    try:
        for i, model in enumerate((SMALL, LARGE)):
            stats = worker_pb2.WorkerStats(
                worker_id=f"w-{model}", model=model, grpc_address=f"127.0.0.1:{7100 + i}", max_batch=4,
                kv_blocks_total=100, heartbeat_interval_s=interval_s, timestamp=time.time(),
            )  # fmt: skip
            await nc.publish(worker_stats_subject(stats.worker_id), stats.SerializeToString())
        await nc.flush()
    finally:
        await nc.close()


def placements_counted(model: str) -> float:
    value = REGISTRY.get_sample_value("cv_scheduler_group_placements_total", {"group": GROUP, "model": model})
    return value or 0.0


async def started(app: SchedulerApp, nats_url: str) -> AsyncIterator[scheduler_pb2_grpc.SchedulerStub]:
    await app.start()
    try:
        async with channel(f"127.0.0.1:{app.port}") as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            deadline = time.monotonic() + 10
            # Reports until the scheduler has both (its NATS connection comes up in the background).
            while len((await stub.Snapshot(scheduler_pb2.SnapshotRequest())).workers) < 2:
                assert time.monotonic() < deadline, "the workers' reports never arrived"
                await heartbeat(nats_url, interval_s=10.0)
                await asyncio.sleep(0.1)
            yield stub
    finally:
        await app.stop()


@pytest.mark.integration
async def test_group_calls_are_placed_on_a_chosen_model(nats_server: str, tmp_path: Path) -> None:
    path = write_groups(tmp_path)
    settings = SchedulerSettings(
        nats_url=nats_server, scheduler_port=0, metrics_port=0, policy="aragog", model_groups=path
    )
    before = {model: placements_counted(model) for model in (SMALL, LARGE)}
    async for stub in started(SchedulerApp(settings), nats_server):
        snapshot = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
        assert [(g.name, list(g.models)) for g in snapshot.groups] == [(GROUP, [SMALL, LARGE])]

        routed = await stub.Schedule(
            scheduler_pb2.ScheduleRequest(request_id="r1", model=GROUP, app_metadata=META, input_text=TASK)
        )
        assert routed.model in (SMALL, LARGE) and routed.worker_id == f"w-{routed.model}"
        # No app_metadata: the call runs on the group's reference (last) model.
        bare = await stub.Schedule(scheduler_pb2.ScheduleRequest(request_id="r2", model=GROUP, input_text=TASK))
        assert (bare.model, bare.worker_id) == (LARGE, f"w-{LARGE}")
        served = await stub.Schedule(scheduler_pb2.ScheduleRequest(request_id="r3", model=SMALL))
        assert served.model == SMALL  # a served model's call names its own model
        counted = {model: placements_counted(model) - before[model] for model in (SMALL, LARGE)}
        assert counted == {routed.model: 1 + (routed.model == LARGE), LARGE: 1 + (routed.model == LARGE)}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Schedule(scheduler_pb2.ScheduleRequest(request_id="r4", model="nope"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
async def test_dispatch_runs_when_the_policy_asks_to_be_woken(nats_server: str, tmp_path: Path) -> None:
    """With a modelled router time, a workflow's first call is held back while its search "runs";
    nothing else happens meanwhile (one heartbeat, the expiry pass 30 s away), so only the wake
    timer can place it, as soon as the search is over."""
    path = write_groups(tmp_path)
    groups = load_model_groups(path)
    routers = {(GROUP, "self_refine"): TableRouter.from_dict(json.loads((tmp_path / "self_refine.json").read_text()))}
    routing = AragogRouting(groups=groups, routers=routers, router_call_s=0.1, min_budget_s=1.0)
    space = groups.groups[GROUP].workflows["self_refine"].space
    search_s = AragogSearch(routers, 0.1).configuration_set(groups.groups[GROUP], space, TASK, 1.0).routing_s
    assert 0.2 <= search_s <= 1.0
    policies = SchedulerPolicies(PRIORITY_POLICIES.create("fcfs"), routing, groups)
    settings = SchedulerSettings(
        nats_url=nats_server, scheduler_port=0, metrics_port=0, policy="aragog", expiry_interval_s=30.0
    )
    async for stub in started(SchedulerApp(settings, policies=policies), nats_server):
        asked = time.monotonic()
        placement = await stub.Schedule(
            scheduler_pb2.ScheduleRequest(request_id="r1", model=GROUP, app_metadata=META, input_text=TASK)
        )
        waited = time.monotonic() - asked
    assert placement.model in (SMALL, LARGE)
    assert search_s - 0.01 <= placement.queue_wait_s <= waited < search_s + 1.0
