"""Incremental ranking is exact: every preset decides as a full re-rank of the queue would.

A preset's scheduler (heaps kept across dispatches through ``FIXED_PRIORITY`` or
``INCREMENTAL_PRIORITY``, routing with its per-worker caches) and a reference scheduler (the same
priority behind a wrapper that hides those hooks, so every dispatch evaluates every queued request,
and routing policies with their caches off) see the same random submits, cancellations,
completions, heartbeats, drains, expiries, workflow ends and dispatches; they must make the same
decisions, with the same base priorities, in the same order.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import NoWorkers
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy import Capability, capabilities_of
from clairvoyant.policy.scheduling import PriorityPolicy
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, QueuedRequest, WorkerReport, build_policies

pytestmark = pytest.mark.unit

WORKERS = (("w0", "a", 1), ("w1", "a", 2), ("w2", "b", 1))  # (id, model, max_batch)
AGENTS = ("plan", "code", "test")
KINDS = ("submit", "submit", "submit", "dispatch", "dispatch", "complete", "complete", "abandon",
         "cancel", "heartbeat", "drain", "end", "expire")  # fmt: skip


def full_rerank(policy: PriorityPolicy) -> Any:
    """``policy`` without FIXED_PRIORITY and INCREMENTAL_PRIORITY: the scheduler re-ranks it all."""
    methods: dict[str, Any] = {"priority": lambda self, request, now: policy.priority(request, now)}
    kept = capabilities_of(policy) & {Capability.PROGRAM_AWARE, Capability.SCHEDULER_AWARE}
    for capability in kept:
        methods[capability.value] = _forward(getattr(policy, capability.value))
    methods["capabilities"] = frozenset(kept)
    return type("FullRerank", (), methods)()


def _forward(hook: Any) -> Any:
    return lambda self, arg: hook(arg)


def reference_routing(routing: Any) -> Any:
    """The routing policy with its caches off, where it has any (they must not change a choice)."""
    if hasattr(routing, "cache"):
        routing.cache = False
    return routing


class _Driver:
    """Turns one op (a kind and a seed) into the same calls on both schedulers."""

    def __init__(self, preset: str) -> None:
        priority, routing = build_policies(preset)
        self.fast = GlobalScheduler(priority, routing, policy_name=preset, max_queue_per_model=10_000)
        ref_priority, ref_routing = build_policies(preset)
        self.ref = GlobalScheduler(
            full_rerank(ref_priority), reference_routing(ref_routing), policy_name=preset, max_queue_per_model=10_000
        )
        self.now = 0.0
        self.count = 0
        self.preemptions = {w: 0 for w, _, _ in WORKERS}
        self.program_calls: dict[str, list[str]] = {}
        self.cancelled: list[QueuedRequest] = []
        self.decided = 0
        for worker_id, _, _ in WORKERS:
            self._report(worker_id, random.Random(worker_id))

    def both(self, call: Any) -> Any:
        """Apply ``call`` to both schedulers; they must answer (or raise) alike."""
        outcomes = []
        for sched in (self.fast, self.ref):
            try:
                outcomes.append(("ok", call(sched)))
            except NoWorkers as error:
                outcomes.append(("raised", str(error)))
        assert outcomes[0] == outcomes[1]
        return outcomes[0][1]

    def step(self, kind: str, seed: int) -> None:
        rng = random.Random(seed)
        self.now += rng.choice([0.0, 0.0, 0.01, 0.04, 0.1, 0.3, 1.5])
        getattr(self, "_" + kind)(rng)
        for sched in (self.fast, self.ref):
            sched.check_integrity()

    def _request(self, rng: random.Random) -> QueuedRequest:
        if self.cancelled and rng.random() < 0.2:  # a cancelled id comes back, as it was
            return self.cancelled.pop(rng.randrange(len(self.cancelled)))
        self.count += 1
        rid = f"r{self.count}"
        tenant = rng.choice(["t1", "t2"])
        meta = None
        if rng.random() < 0.85:
            program = f"p{rng.randrange(6)}"
            earlier = self.program_calls.setdefault(program, [])
            parents = tuple(rng.sample(earlier, k=min(len(earlier), rng.randint(0, 2))))
            meta = AppMetadata(
                rng.choice(["wa", "wb"]), program, rng.choice(AGENTS), parent_request_ids=parents,
                workflow_end=rng.random() < 0.1,
            )  # fmt: skip
            earlier.append(rid)
        annotations = None
        if rng.random() < 0.8:
            annotations = common_pb2.SysAnnotations(
                confidence=rng.choice([common_pb2.CONFIDENCE_HIGH, common_pb2.CONFIDENCE_LOW, common_pb2.CONFIDENCE_NONE]),
                expected_remaining_steps=float(rng.randint(0, 4)),
                expected_remaining_time_s=rng.choice([0.0, 1.0, 5.0]),
                predicted_output_len=common_pb2.LengthInterval(p50=rng.randint(10, 300), p99=rng.randint(300, 900)),
            )
            if rng.random() < 0.7:
                annotations.kairos_rank = float(rng.randint(0, 3))
            for agent in rng.sample(AGENTS, k=rng.randint(0, 2)):
                annotations.next_agents.add(agent_id=agent, probability=rng.choice([0.25, 0.5, 1.0]))
        return QueuedRequest(
            rid, tenant, rng.choice(["a", "a", "b"]), self.now, prompt_tokens=rng.choice([50, 400, 3000]),
            max_tokens=rng.choice([0, 64, 512]), app_metadata=meta,
            annotations=annotations_from_proto(annotations) if annotations is not None else None,
        )  # fmt: skip

    def _submit(self, rng: random.Random) -> None:
        request = self._request(rng)  # a cancelled one keeps its arrival: arrivals need not rise
        self.both(lambda sched: sched.submit(request, now=self.now))

    def _dispatch(self, rng: random.Random) -> None:
        logs = [
            [(d.request_id, d.worker_id, d.base_priority, d.queue_wait_s) for d in sched.dispatch(self.now)]
            for sched in (self.fast, self.ref)
        ]
        assert logs[0] == logs[1]
        self.decided += len(logs[0])

    def _placed(self) -> list[str]:
        return sorted(r.request_id for w in self.ref.workers() for r in self.ref.placed_requests(w.worker_id))

    def _complete(self, rng: random.Random) -> None:
        placed = self._placed()
        if placed:
            rid, service = rng.choice(placed), rng.choice([0.05, 0.5, 2.0, 9.0])
            self.both(lambda sched: sched.complete(rid, now=self.now, service_s=service, output_tokens=10))

    def _abandon(self, rng: random.Random) -> None:
        placed = self._placed()
        if placed:
            rid = rng.choice(placed)
            self.both(lambda sched: sched.complete(rid))

    def _cancel(self, rng: random.Random) -> None:
        queued = self.ref.queued_requests()
        if queued:
            request = rng.choice(queued)
            self.both(lambda sched: sched.cancel(request.request_id))
            self.cancelled.append(request)

    def _heartbeat(self, rng: random.Random) -> None:
        self._report(rng.choice([w for w, _, _ in WORKERS]), rng)

    def _report(self, worker_id: str, rng: random.Random) -> None:
        _, model, max_batch = next(w for w in WORKERS if w[0] == worker_id)
        if rng.random() < 0.3:
            self.preemptions[worker_id] += 1
        total = rng.choice([0, 60, 400])
        report = WorkerReport(
            worker_id, model, f"{worker_id}:1", max_batch=max_batch, queued=rng.choice([0, 0, 1, 3]),
            kv_blocks_total=total, kv_blocks_used=rng.randint(0, total), max_model_len=4096, block_size=16,
            preemptions_total=self.preemptions[worker_id],
        )  # fmt: skip
        self.both(lambda sched: sched.update_worker(report, self.now))

    def _drain(self, rng: random.Random) -> None:
        worker_id, on = rng.choice([w for w, _, _ in WORKERS]), rng.random() < 0.5
        self.both(lambda sched: sched.drain(worker_id, on))

    def _end(self, rng: random.Random) -> None:
        tenant, program = rng.choice(["t1", "t2"]), f"p{rng.randrange(6)}"
        self.both(lambda sched: sched.end_workflow(tenant, program))

    def _expire(self, rng: random.Random) -> None:
        expired = self.both(lambda sched: sched.expire_workers(self.now))
        for gone in expired:  # it comes back at once, empty
            self._report(gone.worker_id, rng)

OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**31)), min_size=30, max_size=150)


@pytest.mark.parametrize(
    "preset",
    PRESETS.names(),
)
@settings(
    max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate],  # a failure prints its ops; shrinking them is slow
)  # fmt: skip
@given(ops=OPS)
def test_fast_ranking_decides_as_a_full_re_rank(preset: str, ops: list[tuple[str, int]]) -> None:
    driver = _Driver(preset)
    for kind, seed in ops:
        driver.step(kind, seed)
    # Drain the queue: free everything and dispatch until nothing moves.
    for _ in range(40):
        for rid in driver._placed():
            driver.both(lambda sched, rid=rid: sched.complete(rid, now=driver.now, service_s=1.0))
        driver.now += 0.2
        driver._dispatch(random.Random(0))
    assert driver.fast.queue_depths() == driver.ref.queue_depths()


def test_the_reference_really_re_ranks_and_the_presets_really_do_not() -> None:
    """The comparison above is between two code paths: the wrapper hides the hooks, and every
    program-aware preset ranks through one of them."""
    for preset in PRESETS.names():
        priority, _ = build_policies(preset)
        hidden = full_rerank(priority)
        ranking = {Capability.FIXED_PRIORITY, Capability.INCREMENTAL_PRIORITY}
        assert not capabilities_of(hidden) & ranking
        assert capabilities_of(priority) & ranking, preset


def test_a_busy_run_places_many_requests() -> None:
    """The random runs are not vacuous: a typical one makes dozens of decisions."""
    rng = random.Random(3)
    driver = _Driver("plas")
    for _ in range(300):
        kind = rng.choice(KINDS)
        driver.step(kind, rng.randrange(2**31))
    assert driver.decided > 40


def test_a_view_with_another_placement_count_is_replace() -> None:
    import dataclasses

    from clairvoyant.scheduler.core import WorkerView

    view = WorkerView("w", "m", "a", "h", 1, 2, 3, 8, 5, 9, 4096, True, 7.5, 1.0, admission_limit=64, block_size=16)
    assert view.with_placed(4) == dataclasses.replace(view, placed=4)
    # Every field above has a value other than its default: a field added later must be too.
    assert len(dataclasses.fields(WorkerView)) == 16
    assert view.with_placed(4) is not view and view.placed == 3


@pytest.mark.parametrize("seed", range(20))
def test_the_one_pass_least_used_choice_is_the_minimum_over_the_eligible(seed: int) -> None:
    from clairvoyant.policy.scheduling import least_used_eligible
    from clairvoyant.scheduler.core import WorkerView, eligible_workers

    rng = random.Random(seed)
    workers = [
        WorkerView(
            f"w{rng.randrange(100):02d}-{i}", rng.choice(["a", "b"]), "", "", 0, 0, rng.randint(0, 4), 3,
            rng.randint(0, 2), rng.choice([0, 4]), 0, rng.random() < 0.2, 0.0, 1.0,
            admission_limit=rng.choice([0, 5]),
        )  # fmt: skip
        for i in range(rng.randint(0, 12))
    ]
    request = QueuedRequest("r", "t", "a", 0.0, exclude_workers=frozenset(w.worker_id for w in workers[:1]))
    eligible = eligible_workers(request, workers)
    expected = min(eligible, key=lambda w: (w.placed, w.kv_usage, w.worker_id)) if eligible else None
    assert least_used_eligible(request, workers) is expected


@pytest.mark.parametrize("seed", range(10))
def test_the_smallest_tree_in_one_pass_is_the_minimum(seed: int) -> None:
    from clairvoyant.policy.baselines import ApproximateTrees
    from clairvoyant.scheduler.core import WorkerView

    rng = random.Random(seed)
    trees = ApproximateTrees()
    ids = [f"w{i}" for i in range(8)]
    for n in range(rng.randint(0, 20)):
        trees.insert(rng.choice(ids), ("t", f"s{n % 5}"), rng.choice([100, 200, 300]))
    candidates = [
        WorkerView(wid, "m", "", "", 0, 0, rng.randint(0, 3), 8, 0, 0, 0, False, 0.0, 1.0)
        for wid in rng.sample(ids, k=rng.randint(1, 8))
    ]
    expected = min(candidates, key=lambda w: (trees.size(w.worker_id), w.placed, w.worker_id))
    assert trees.smallest(candidates) is expected
