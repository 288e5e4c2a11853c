"""Autoscaling in the simulator: cold starts, the GPU budget, drains and releases, GPU-seconds,
no lost call when a model scales to zero and back, a fan-out provisioned ahead of time, and the
calls still waiting in a drained replica's engine placed again elsewhere.

Unit-time replicas (one step = 1 s) and small policies of the tests' own drive the autoscaler, so
the times below can be checked by hand; the registered ``pythia`` runs the fan-out case."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, run_sim
from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.annotations import OracleAnnotator
from clairvoyant.bench.sim.autoscaling import SimAutoscaler, fitting_counts, replicas_at
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator, SteppedRunner
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.bench.workloads import get_workload
from clairvoyant.core.annotations import ProjectedCalls
from clairvoyant.policy.scaling import (
    SCALING_POLICIES,
    ModelProfile,
    ReplicaPhase,
    ScalingDecision,
    ScalingInput,
    ScalingPolicy,
    replicas_for,
    serving_counts,
)
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, NewSegment, WorkflowProgram

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]

PLANNER, EXPLORER = "planner-llm", "explorer-llm"


def _replica(model: str, replica_id: str, seats: int = 4) -> ReplicaSpec:
    config = EngineConfig(block_size=4, num_blocks=512, max_num_seqs=seats, enable_prefix_cache=False)
    return ReplicaSpec(replica_id, cast(SteppedRunner, UnitTimeRunner(model)), config)


def _profile(model: str, startup_s: float = 10.0, calls: float = 4.0) -> ModelProfile:
    return ModelProfile(model, gpus_per_replica=1, calls_per_replica=calls, startup_s=startup_s)


def _call(wf: str, index: int, agent: str, model: str, out: int, deps: tuple[int, ...] = (), tool_s: float = 0.0) -> Call:
    return Call(f"{wf}/{index}", index, agent, model, (NewSegment("new", 4),), 4, out,
                tuple(f"{wf}/{d}" for d in deps), "tool" if tool_s else None, tool_s)  # fmt: skip


def single(wf: str, model: str = PLANNER, out: int = 20) -> WorkflowProgram:
    return WorkflowProgram("single", wf, (_call(wf, 0, "solo", model, out),))


def fan_out(wf: str, width: int = 10, plan_tokens: int = 40) -> WorkflowProgram:
    """planner (``plan_tokens``, tool 2 s) -> explorer x ``width`` (30 tokens each) -> planner join (5)."""
    calls = [_call(wf, 0, "planner", PLANNER, plan_tokens, tool_s=2.0)]
    calls += [_call(wf, 1 + i, "explorer", EXPLORER, 30, (0,)) for i in range(width)]
    calls.append(_call(wf, width + 1, "summarizer", PLANNER, 5, tuple(range(1, width + 1))))
    return WorkflowProgram("fanout", wf, tuple(calls))


class Scripted:
    """Targets from a schedule: ``targets(now)`` per model; no explicit drains."""

    def __init__(self, targets: Callable[[float], dict[str, int]]) -> None:
        self.targets = targets
        self.seen: list[ScalingInput] = []

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        self.seen.append(state)
        return ScalingDecision(targets={**serving_counts(state.replicas), **self.targets(now)})


class DrainAt:
    """Drains one replica at the first tick at or after ``at``; otherwise static."""

    def __init__(self, replica_id: str, at: float) -> None:
        self.replica_id, self.at = replica_id, at

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        serving = serving_counts(state.replicas)
        mine = next((r for r in state.replicas if r.replica_id == self.replica_id), None)
        if now >= self.at and mine is not None and not mine.draining:
            serving[mine.model] -= 1
            return ScalingDecision(targets=serving, drain=(self.replica_id,))
        return ScalingDecision(targets=serving)


class ProjectionAhead:
    """Scales each model to what the calls in flight project for it in the next two steps (the
    idea of Pythia Alg. 4 in a few lines), never below one replica."""

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        demand: dict[str, float] = {model: 0.0 for model in state.models}
        for call in state.active:
            demand[call.model] += 1.0
            terms: list[ProjectedCalls] = list(call.annotations.projection) if call.annotations else []
            for term in terms:
                if term.step <= 2 and call.workflow_type_id is not None:
                    model = state.agent_models.get((call.workflow_type_id, term.agent_id))
                    if model is not None:
                        demand[model] += term.expected_calls
        return ScalingDecision(
            targets={m: max(1, replicas_for(d, state.models[m].calls_per_replica)) for m, d in demand.items()}
        )


def _run(
    policy: ScalingPolicy,
    arrivals: list[tuple[float, WorkflowProgram]],
    *,
    initial: dict[str, int],
    budget: int,
    profiles: dict[str, ModelProfile],
    seats: int = 4,
    annotator: OracleAnnotator | None = None,
    interval_s: float = 5.0,
) -> tuple[RunRecords, SimAutoscaler, Simulator]:
    replicas = [_replica(model, f"{model}-{i}", seats) for model, n in sorted(initial.items()) for i in range(n)]
    sim = Simulator(replicas, "fcfs-rr", annotator=annotator)
    scaler = SimAutoscaler(
        sim, policy, profiles, budget, lambda model, rid: _replica(model, rid, seats), interval_s=interval_s,
        agent_models={("fanout", "planner"): PLANNER, ("fanout", "explorer"): EXPLORER,
                      ("fanout", "summarizer"): PLANNER},
    )  # fmt: skip
    records = sim.run(arrivals)
    scaler.finish(sim.events.now)
    return records, scaler, sim


def test_a_replica_joins_only_after_its_cold_start() -> None:
    # Two workflows of 20 tokens each on one one-seat replica; a second is started at t=5.
    policy = Scripted(lambda now: {PLANNER: 2} if now >= 5 else {})
    records, scaler, _ = _run(
        policy, [(0.0, single("a")), (0.0, single("b"))], initial={PLANNER: 1}, budget=2,
        profiles={PLANNER: _profile(PLANNER, startup_s=12.0)}, seats=1,
    )  # fmt: skip
    assert scaler.log.replicas[PLANNER] == [[0.0, 1, 1], [5.0, 1, 2], [17.0, 2, 2]]
    second = next(c for c in records.calls if c.call_id == "b/0")
    assert (second.worker_id, second.dispatch_time, second.start_time) == (f"{PLANNER}-1", 17.0, 17.0)
    assert scaler.log.scale_ups == 1
    # While it started, the policy saw it as STARTING, with the time it was provisioned.
    starting = [r for state in policy.seen for r in state.replicas if r.replica_id == f"{PLANNER}-1"]
    assert starting[0].phase is ReplicaPhase.STARTING and starting[0].since == 5.0
    assert {r.phase for r in starting} == {ReplicaPhase.STARTING, ReplicaPhase.READY}


def test_the_gpu_budget_is_never_exceeded() -> None:
    profiles = {PLANNER: _profile(PLANNER, 7.0), EXPLORER: _profile(EXPLORER, 3.0)}
    greedy = Scripted(lambda now: {PLANNER: 9, EXPLORER: 9} if int(now) % 20 < 10 else {PLANNER: 1, EXPLORER: 0})
    arrivals = [(float(3 * i), fan_out(f"f{i}")) for i in range(6)]
    records, scaler, sim = _run(greedy, arrivals, initial={PLANNER: 1, EXPLORER: 1}, budget=5, profiles=profiles)
    assert all(w.end_time is not None for w in records.workflows)
    assert len(scaler.log.ticks) > 5 and scaler.log.clamped_ticks > 0
    for tick in scaler.log.ticks:
        assert tick.gpus_held <= 5
    assert max(t.gpus_held for t in scaler.log.ticks) == 5
    # The GPUs held before each tick's actions (what the policy saw) are within the budget too.
    held = [sum(r.gpus for r in state.replicas) for state in greedy.seen]
    assert max(held) <= 5
    assert scaler.log.drains > 0 and scaler.log.releases > 0


def test_a_draining_replica_gets_no_new_placement_and_a_released_one_was_idle() -> None:
    profiles = {PLANNER: _profile(PLANNER), EXPLORER: _profile(EXPLORER)}
    arrivals = [(float(2 * i), fan_out(f"f{i}")) for i in range(6)]
    drained = f"{EXPLORER}-0"
    records, scaler, _ = _run(
        DrainAt(drained, 60.0), arrivals, initial={PLANNER: 1, EXPLORER: 2}, budget=3, profiles=profiles
    )
    drain_tick = next(t for t in scaler.log.ticks if drained in t.actions.drain)
    release_tick = next(t for t in scaler.log.ticks if drained in t.actions.release)
    on_it = [c for c in records.calls if c.worker_id == drained]
    assert on_it and all(c.dispatch_time is not None and c.dispatch_time <= drain_tick.time for c in on_it)
    later = [c for c in records.calls if c.model == EXPLORER and c.dispatch_time and c.dispatch_time > drain_tick.time]
    assert later and {c.worker_id for c in later} == {f"{EXPLORER}-1"}
    # Released once idle: every call it ran had ended by then, and it was released at the first
    # tick after its last call ended (no keep-alive).
    last_end = max(c.end_time for c in on_it if c.end_time is not None)
    assert last_end <= release_tick.time < last_end + scaler.interval_s
    assert all(w.end_time is not None for w in records.workflows)


class DrainChecked(DrainAt):
    """``DrainAt`` that runs ``check`` at every tick, before the tick's actions."""

    def __init__(self, replica_id: str, at: float) -> None:
        super().__init__(replica_id, at)
        self.check: Callable[[float], None] = lambda now: None

    def tick(self, state: ScalingInput, now: float) -> ScalingDecision:
        self.check(now)
        return super().tick(state, now)


def _check_integrity(sim: Simulator) -> None:
    sim.scheduler.check_integrity()
    for replica in sim.replicas.values():
        replica.engine.check_integrity()


# An engine-queueing preset: fcfs with session affinity, placements up to 8 x a replica's batch.
ENGINE_QUEUEING = "vllm-prodstack"


def _queued_at_drain(hand_back: bool) -> tuple[RunRecords, SimAutoscaler, Simulator, list[int]]:
    """p-0 (one seat) and p-1 (four seats); four 20-token calls at t=0 alternate between them
    (fewest placements, then the smaller id): p-0 runs a and holds c waiting, p-1 runs b and d.
    p-0 is drained at t=5.  Returns the run and the tokens each replica generated."""
    sim = Simulator([_replica(PLANNER, "p-0", seats=1), _replica(PLANNER, "p-1", seats=4)], ENGINE_QUEUEING)
    engines = {rid: replica.engine for rid, replica in sim.replicas.items()}  # p-0's leaves the run
    policy = DrainChecked("p-0", 5.0)
    policy.check = lambda now: _check_integrity(sim)
    scaler = SimAutoscaler(
        sim, policy, {PLANNER: _profile(PLANNER)}, 2, lambda model, rid: _replica(model, rid),
        hand_back=hand_back,
    )  # fmt: skip
    records = sim.run([(0.0, single(wf)) for wf in "abcd"])
    scaler.finish(sim.events.now)
    _check_integrity(sim)
    return records, scaler, sim, [engines[rid].stats().generated_tokens_total for rid in ("p-0", "p-1")]


def test_a_release_waits_for_engine_work_no_placement_counts() -> None:
    """A cache manager's pre-prefill on a drained replica is work no placement counts: the release
    the policy asks for waits until the engine is idle (it crashed the run before), and no start
    takes the GPUs that release would have freed."""
    sim = Simulator([_replica(PLANNER, "p-0"), _replica(PLANNER, "p-1")], "fcfs-rr")
    policy = DrainChecked("p-0", 5.0)
    injected: list[float] = []

    def inject(now: float) -> None:
        replica = sim.replicas.get("p-0")
        idle = replica is not None and not sim.scheduler.placed_requests("p-0") and not replica.engine.has_unfinished()
        if now > 5.0 and idle and not injected and replica is not None:
            sim._stepper.between_steps(replica, lambda: replica.engine.pre_prefill(None, [i % 250 + 1 for i in range(400)]))
            injected.append(now)
        assert sum(h.gpus for h in scaler._held.values()) <= 2  # never over the budget

    policy.check = inject
    scaler = SimAutoscaler(sim, policy, {PLANNER: _profile(PLANNER)}, 2, lambda model, rid: _replica(model, rid))
    records = sim.run([(float(i), single(f"w{i}", out=30)) for i in range(12)])
    scaler.finish(sim.events.now)
    assert injected, "the drained replica went idle while the run went on"
    assert scaler.log.deferred_releases >= 1
    release_tick = next(t for t in scaler.log.ticks if "p-0" in t.actions.release)
    assert release_tick.time > injected[0]
    assert "p-0" not in sim.replicas and scaler.log.releases == 1
    assert all(w.end_time is not None for w in records.workflows)
    assert scaler.log.summary()["deferred_releases"] == scaler.log.deferred_releases


def test_a_drained_replicas_waiting_calls_are_placed_again_on_another_replica() -> None:
    records, scaler, sim, generated = _queued_at_drain(hand_back=True)
    by_id = {c.call_id: c for c in records.calls}
    # c never started on p-0: at the drain it went back to the global queue, p-1 took it at once,
    # and it joined p-1's batch at its next step (t=6).  Its record names the final placement.
    c = by_id["c/0"]
    assert (c.worker_id, c.dispatch_time, c.start_time, c.end_time) == ("p-1", 5.0, 6.0, 26.0)
    assert c.queue_s == 6.0  # its wait counts from when it became ready
    assert [(by_id[i].worker_id, by_id[i].end_time) for i in ("a/0", "b/0", "d/0")] == [
        ("p-0", 20.0), ("p-1", 20.0), ("p-1", 20.0),
    ]  # fmt: skip
    assert scaler.log.replaced_calls == scaler.log.summary()["replaced_calls"] == 1
    # p-0 is released at the first tick after a, its one running call, ended: two GPUs until
    # t=20, one until the run's end at 26.
    release = next(t.time for t in scaler.log.ticks if "p-0" in t.actions.release)
    assert release == 20.0 and "p-0" not in sim.replicas
    assert scaler.log.gpu_seconds == 2 * 20 + 1 * 6
    # No call lost or served twice: four served, each once, on one replica.
    assert len(records.calls) == 4 and all(not r.rejected and r.generated_tokens == 20 for r in records.calls)
    assert all(w.end_time is not None for w in records.workflows)
    assert generated == [20, 60]
    traffic = sim.scheduler.traffic()[PLANNER]
    assert (traffic.requests_total, traffic.completed_total, traffic.output_tokens_total) == (5, 4, 80)


def test_without_handing_back_the_drained_replica_serves_its_queue_and_leaves_later() -> None:
    records, scaler, _, generated = _queued_at_drain(hand_back=False)
    c = next(r for r in records.calls if r.call_id == "c/0")
    assert (c.worker_id, c.dispatch_time, c.start_time, c.end_time) == ("p-0", 0.0, 20.0, 40.0)
    # p-0 serves c after a, and is still draining when the run ends with c at t=40.
    assert not any(t.actions.release for t in scaler.log.ticks) and scaler.log.replaced_calls == 0
    assert replicas_at(scaler.log.replicas[PLANNER], 39.0) == (1, 2)
    assert scaler.log.gpu_seconds == 2 * 40
    assert generated == [40, 40]
    placed_again, _, _, _ = _queued_at_drain(hand_back=True)
    assert max(w.jct_s for w in placed_again.workflows) < max(w.jct_s for w in records.workflows)


def _drained_mid_decode_run(fast_forward: bool) -> tuple[str, SimAutoscaler, list[str]]:
    """Emulated 8B replicas (one seat on w-0, four on w-1) run a and b, 2,000 tokens each, from
    t=0; c is ready at t=5, placed on w-0 (fewest placements, equal KV, the smaller id) and waits
    there; the tick at t=5 drains w-0.  Returns the records as JSON, the autoscaler, and what
    the drain tick saw on w-0."""
    model = "llama-3.1-8b"

    def replica(worker_id: str, seats: int = 4) -> ReplicaSpec:
        runner = EmulatedRunner(model, "H100-80G", sleep=lambda _: None, distinct_tokens=True)
        config = EngineConfig(block_size=16, num_blocks=4096, max_num_seqs=seats)
        return ReplicaSpec(worker_id, runner, config)

    sim = Simulator([replica("w-0", 1), replica("w-1")], ENGINE_QUEUEING, fast_forward=fast_forward)
    policy = DrainChecked("w-0", 5.0)
    seen: list[str] = []

    def check(now: float) -> None:
        _check_integrity(sim)
        if now == 5.0:
            held = sim.replicas["w-0"]
            waiting = [seq.request_id for seq in held.engine.scheduler.waiting]
            seen.append(f"mid-run={held.run is not None} waiting={waiting}")

    policy.check = check
    scaler = SimAutoscaler(sim, policy, {model: _profile(model)}, 2, lambda m, rid: replica(rid))
    arrivals = [(0.0, single("a", model, 2000)), (0.0, single("b", model, 2000)), (5.0, single("c", model, 50))]
    records = sim.run(arrivals)
    scaler.finish(sim.events.now)
    _check_integrity(sim)
    return json.dumps([vars(c) for c in records.calls], sort_keys=True), scaler, seen


def test_a_call_handed_back_mid_decode_run_gives_the_step_by_step_results() -> None:
    fast, scaler, seen = _drained_mid_decode_run(fast_forward=True)
    stepped, _, seen_stepped = _drained_mid_decode_run(fast_forward=False)
    assert seen == ["mid-run=True waiting=['c/0']"] and seen_stepped == ["mid-run=False waiting=['c/0']"]
    assert fast == stepped
    calls = {call["call_id"]: call for call in json.loads(fast)}
    c, a = calls["c/0"], calls["a/0"]
    assert (c["worker_id"], c["dispatch_time"], c["generated_tokens"]) == ("w-1", 5.0, 50)
    assert c["end_time"] < a["end_time"]  # it joined w-1's batch instead of waiting for a on w-0
    assert a["worker_id"] == "w-0" and scaler.log.replaced_calls == 1


def test_static_scaling_reproduces_the_fixed_cluster_run_exactly() -> None:
    config = ExperimentConfig(workload="deep_research", gpus=2, workflows=10, concurrency=5, seed=4, block_size=64)
    fixed = run_sim(config, "least-loaded")
    scaled = run_sim(dataclasses.replace(config, scaling="static"), "least-loaded")
    added = {"scaling", "autoscaling", "global_queue_s_by_model"}
    assert set(scaled) - set(fixed) == added
    # With scaling the capacity bound sees only the budget (GPUs may move between models), so it
    # is no tighter than the fixed cluster's, which also bounds each model on its own GPUs.
    bounds = {"capacity_bound_avg_jct_s", "limit_avg_jct_s", "avg_jct_over_limit"}
    for key in set(fixed) - {"wall_seconds"} - bounds:
        assert scaled[key] == fixed[key], key
    assert scaled["capacity_bound_avg_jct_s"] <= fixed["capacity_bound_avg_jct_s"]
    assert scaled["limit_avg_jct_s"] <= fixed["limit_avg_jct_s"]
    assert scaled["autoscaling"]["scale_ups"] == scaled["autoscaling"]["drains"] == 0
    assert scaled["autoscaling"]["gpu_seconds"] == pytest.approx(2 * fixed["virtual_seconds"])


def test_static_scaling_leaves_every_record_as_the_fixed_cluster() -> None:
    arrivals = [(float(3 * i), fan_out(f"f{i}")) for i in range(5)]

    def records(scaled: bool) -> str:
        replicas = [_replica(PLANNER, "p-0"), _replica(EXPLORER, "e-0")]
        sim = Simulator(replicas, "fcfs-rr")
        if scaled:
            profiles = {PLANNER: _profile(PLANNER), EXPLORER: _profile(EXPLORER)}
            static = SCALING_POLICIES.create("static")
            SimAutoscaler(sim, static, profiles, 2, lambda model, rid: _replica(model, rid), interval_s=0.7)
        run = sim.run(arrivals)
        return json.dumps([[vars(c) for c in run.calls], [vars(w) for w in run.workflows], run.queue_depth,
                           run.duration_s, run.preemptions], sort_keys=True)  # fmt: skip

    assert records(scaled=True) == records(scaled=False)


def test_gpu_seconds_are_the_integral_of_the_gpus_held() -> None:
    # One 20-token call on replica 0 from t=0.  Tick 0 starts a second replica (cold start 10 s);
    # tick 10, when it has just joined, drains it (idle: released at once).  GPUs: 2 on [0, 10),
    # 1 on [10, end], end = the call's last step = 20 s (one prefill step, 19 decodes).
    policy = Scripted(lambda now: {PLANNER: 2} if now < 10 else {PLANNER: 1})
    records, scaler, sim = _run(
        policy, [(0.0, single("a"))], initial={PLANNER: 1}, budget=2, profiles={PLANNER: _profile(PLANNER, 10.0)}
    )
    assert records.duration_s == sim.events.now == 20.0
    assert scaler.log.gpu_seconds == 2 * 10 + 1 * (20 - 10)
    assert (scaler.log.scale_ups, scaler.log.drains, scaler.log.releases) == (1, 1, 1)
    assert replicas_at(scaler.log.replicas[PLANNER], 9.9) == (1, 2)
    assert replicas_at(scaler.log.replicas[PLANNER], 10.0) == (1, 1)


def test_no_call_is_lost_when_a_model_scales_to_zero_and_back() -> None:
    # The explorer model has no replica from t=10 to t=80 (its first calls are ready at 42): they
    # wait in the global queue.
    policy = Scripted(lambda now: {EXPLORER: 0} if 10 <= now < 80 else {EXPLORER: 1})
    profiles = {PLANNER: _profile(PLANNER), EXPLORER: _profile(EXPLORER, startup_s=6.0)}
    arrivals = [(float(4 * i), fan_out(f"f{i}", width=3)) for i in range(8)]
    records, scaler, _ = _run(policy, arrivals, initial={PLANNER: 1, EXPLORER: 1}, budget=2, profiles=profiles)
    assert len(records.workflows) == 8 and all(w.end_time is not None for w in records.workflows)
    assert len(records.calls) == 8 * 5 and not any(c.rejected for c in records.calls)
    assert all(c.end_time is not None for c in records.calls)
    series = scaler.log.replicas[EXPLORER]
    assert replicas_at(series, 20.0) == (0, 0) and replicas_at(series, 86.0) == (1, 1)
    waited = [c for c in records.calls if c.model == EXPLORER and c.ready_time < 80]
    assert len(waited) >= 3 and min(c.dispatch_time or 0 for c in waited) == 86.0  # tick 80 + 6 s cold start


def _fan_out_run(policy: ScalingPolicy, plan_tokens: int = 40) -> tuple[RunRecords, SimAutoscaler]:
    profiles = {PLANNER: _profile(PLANNER, 5.0, calls=4), EXPLORER: _profile(EXPLORER, 8.0, calls=2)}
    arrivals = [(float(10 * i), fan_out(f"f{i}", plan_tokens=plan_tokens)) for i in range(4)]
    records, scaler, _ = _run(
        policy, arrivals, initial={PLANNER: 1, EXPLORER: 1}, budget=8, profiles=profiles, seats=2,
        annotator=OracleAnnotator(),
    )  # fmt: skip
    return records, scaler


def _explorer_wait(records: RunRecords) -> float:
    waits = [c.dispatch_time - c.ready_time for c in records.calls if c.model == EXPLORER and c.dispatch_time is not None]
    return sum(waits) / len(waits)


def test_scaling_the_fan_out_model_up_ahead_beats_static() -> None:
    ahead, ahead_scaler = _fan_out_run(ProjectionAhead())
    static, static_scaler = _fan_out_run(SCALING_POLICIES.create("static"))
    assert _explorer_wait(ahead) * 2 <= _explorer_wait(static)
    assert max(w.jct_s for w in ahead.workflows) < max(w.jct_s for w in static.workflows)
    # The explorers were started while the first planner still ran (its projection said so).
    first_plan_end = next(c.end_time for c in ahead.calls if c.call_id == "f0/0")
    assert first_plan_end is not None
    started = [t.time for t in ahead_scaler.log.ticks if t.actions.start.get(EXPLORER)]
    assert started and started[0] < first_plan_end
    assert static_scaler.log.scale_ups == 0


@pytest.mark.skipif("pythia" not in SCALING_POLICIES, reason="the pythia scaling policy is not registered")
def test_pythia_provisions_explorers_before_the_planners_finish() -> None:
    # planner -> explorer{10}: with the oracle's projection pythia starts explorer replicas while
    # the planners still run, and the explorers wait less than under static scaling.
    records, scaler = _fan_out_run(SCALING_POLICIES.create("pythia"), plan_tokens=60)
    static, _ = _fan_out_run(SCALING_POLICIES.create("static"), plan_tokens=60)
    first_plan_end = next(c.end_time for c in records.calls if c.call_id == "f0/0")
    assert first_plan_end is not None
    started = [t.time for t in scaler.log.ticks if t.actions.start.get(EXPLORER)]
    assert started and started[0] < first_plan_end
    assert replicas_at(scaler.log.replicas[EXPLORER], first_plan_end + 2.0)[0] > 1  # ready when they come
    assert _explorer_wait(records) * 2 <= _explorer_wait(static)
    assert all(w.end_time is not None for w in records.workflows)


def test_the_oracle_projects_the_workflows_calls_per_step() -> None:
    program = fan_out("p", width=3)
    oracle = OracleAnnotator()
    planner = oracle.annotate(program, program.calls[0], 0.0).projection
    assert [(p.step, p.agent_id, p.expected_calls) for p in planner] == [(1, "explorer", 3.0), (2, "summarizer", 1.0)]
    explorer = oracle.annotate(program, program.calls[1], 0.0).projection
    assert [(p.step, p.agent_id, p.expected_calls) for p in explorer] == [(1, "summarizer", 1.0)]
    assert oracle.annotate(program, program.calls[-1], 0.0).projection == ()


def test_a_constrained_cluster_starts_from_the_placement_that_fits_the_budget() -> None:
    assert fitting_counts({"a": 3, "b": 3}, {"a": 1, "b": 1}, 3) == {"a": 2, "b": 1}
    assert fitting_counts({"a": 1, "b": 2}, {"a": 4, "b": 1}, 3) == {"a": 0, "b": 2}
    config = ExperimentConfig(workload="coding_assistant", gpus=8, scaling="static", gpu_budget=3)
    replicas, _ = build_cluster(get_workload(config.workload), config)
    assert [r.worker_id for r in replicas] == ["qwen2.5-14b-0", "qwen2.5-14b-1", "qwen2.5-7b-0"]
    fixed, _ = build_cluster(get_workload(config.workload), dataclasses.replace(config, scaling=None))
    assert len(fixed) == 8


def test_the_cli_rejects_an_unknown_scaling_policy_listing_the_registered_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--scaling", "nope",
              "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert "unknown scaling policy 'nope'" in str(exc.value) and "static" in str(exc.value)


def test_cli_compare_with_scalings_writes_one_entry_per_scaling_policy(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    code = main(["compare", "--workload", "react_bfcl", "--scalings", "static,static", "--policies", "fcfs-rr",
                 "--gpus", "1", "--gpu-budget", "2", "--workflows", "4", "--concurrency", "2",
                 "--block-size", "64", "--jobs", "1", "--out", str(out)])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "scale-compare" and result["preset"] == "fcfs-rr"
    assert list(result["policies"]) == ["static"]  # named by scaling policy
    metrics = result["policies"]["static"]
    assert metrics["scaling"] == "static" and metrics["workflows"] == 4
    assert metrics["autoscaling"]["gpu_seconds"] == pytest.approx(metrics["virtual_seconds"])
    assert set(metrics["global_queue_s_by_model"]) == {"llama-3.1-8b"}


def test_the_replicas_plot_is_drawn_for_an_autoscaled_compare(tmp_path: Path) -> None:
    from clairvoyant.bench.plots import plot_file

    results = tmp_path / "scale.json"
    assert main(["compare", "--workload", "react_bfcl", "--scalings", "static", "--policies", "fcfs-rr",
                 "--gpus", "1", "--workflows", "3", "--concurrency", "3", "--block-size", "64", "--jobs", "1",
                 "--out", str(results)]) == 0  # fmt: skip
    paths = plot_file(results, tmp_path)
    assert [p.name for p in paths] == ["scale-jct-cdf.png", "scale-queue-depth.png", "scale-replicas.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
