"""Policies and presets: the registries, the eligibility rule, and properties every preset keeps."""

from __future__ import annotations

import random

import pytest

from clairvoyant.policy import Capability
from clairvoyant.scheduler.core import (
    PRESETS,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    GlobalScheduler,
    QueuedRequest,
    WorkerReport,
    WorkerView,
    build_policies,
    eligible_workers,
)

pytestmark = pytest.mark.unit


def view(
    worker_id: str, *, model: str = "m", placed: int = 0, max_batch: int = 2, draining: bool = False
) -> WorkerView:
    return WorkerView(
        worker_id=worker_id, model=model, address="", http_address="", running=0, queued=0, placed=placed,
        max_batch=max_batch, kv_blocks_used=0, kv_blocks_total=0, max_model_len=0, draining=draining,
        last_heartbeat=0.0, heartbeat_interval_s=1.0,
    )  # fmt: skip


def test_eligibility_filters_model_draining_excluded_and_full_workers() -> None:
    workers = [
        view("ok"),
        view("other-model", model="x"),
        view("draining", draining=True),
        view("excluded"),
        view("full", placed=2),
        view("ok2", placed=1),
    ]
    request = QueuedRequest("r", "t", "m", 0.0, exclude_workers=frozenset({"excluded"}))
    assert [w.worker_id for w in eligible_workers(request, workers)] == ["ok", "ok2"]


def test_baseline_presets_are_registered_with_their_policies() -> None:
    assert {"fcfs-rr", "least-loaded"} <= set(PRESETS.names())
    assert PRESETS.create("fcfs-rr")[:2] == ("fcfs", "round-robin")
    assert PRESETS.create("least-loaded")[:2] == ("fcfs", "least-loaded")
    assert {"fcfs"} <= set(PRIORITY_POLICIES) and {"round-robin", "least-loaded"} <= set(ROUTING_POLICIES)
    with pytest.raises(ValueError, match="fcfs-rr"):
        build_policies("no-such-preset")


def test_presets_build_fresh_policy_state() -> None:
    _, first = build_policies("fcfs-rr")
    _, second = build_policies("fcfs-rr")
    assert first is not second  # a round-robin cursor must not leak between schedulers


@pytest.mark.parametrize("preset", PRESETS.names())
def test_every_preset_respects_capacity_and_places_each_request_once(preset: str) -> None:
    rng = random.Random(7)
    sched = GlobalScheduler.from_preset(preset, max_queue_per_model=1000)
    models = ("alpha", "beta")
    for i in range(5):
        sched.update_worker(
            WorkerReport(
                f"w{i}", models[i % 2], f"w{i}:1", max_batch=rng.randint(1, 3), queued=rng.randint(0, 2)
            ),
            now=0.0,
        )
    # The capacity a preset may use: max_batch, or more where calls queue at the engine (Autellix).
    max_batch = {w.worker_id: w.admission_limit or w.max_batch for w in sched.workers()}
    submitted: list[str] = []
    placed: list[str] = []
    outstanding: list[str] = []
    now = 0.0
    for step in range(200):
        now += rng.random()
        if rng.random() < 0.6:
            rid = f"r{step}"
            sched.submit(QueuedRequest(rid, "t", rng.choice(models), now), now=now)
            submitted.append(rid)
        elif outstanding:
            assert sched.complete(outstanding.pop(rng.randrange(len(outstanding))))
        decisions = sched.dispatch(now)
        for model in models:
            priorities = [d.base_priority for d in decisions if d.worker.model == model]
            assert priorities == sorted(priorities, reverse=True)
        placed += [d.request_id for d in decisions]
        outstanding += [d.request_id for d in decisions]
        sched.check_integrity()
        assert all(w.placed <= max_batch[w.worker_id] for w in sched.workers())
    # Free everything, then keep dispatching: an idle cluster must make progress until all are placed.
    while len(placed) < len(submitted):
        for rid in outstanding:
            assert sched.complete(rid)
        now += 1.0
        decisions = sched.dispatch(now)
        assert decisions, "an idle cluster placed nothing while requests waited"
        outstanding = [d.request_id for d in decisions]
        placed += outstanding
        sched.check_integrity()
    assert sorted(placed) == sorted(submitted)  # each exactly once


class _Ranked:
    """A fixed priority that does not say so: the scheduler re-ranks the whole queue every time."""

    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def priority(self, request: QueuedRequest, now: float) -> float:
        return self.values.get(request.request_id, 0.0)


class _Fixed(_Ranked):
    capabilities = frozenset({Capability.FIXED_PRIORITY})

    def priority_is_fixed(self) -> bool:
        return True


@pytest.mark.parametrize("seed", range(5))
def test_a_fixed_priority_heap_dispatches_exactly_as_re_ranking(seed: int) -> None:
    """Submits (some with equal arrival times and priorities), cancels, re-submissions of a
    cancelled id and completions: the same decisions, in the same order."""
    rng = random.Random(seed)
    priorities = {f"r{i}": float(rng.choice([0, 0, 1, 2, -1])) for i in range(300)}
    schedulers = [
        GlobalScheduler(policy, build_policies("least-loaded")[1], max_queue_per_model=1000)
        for policy in (_Ranked(priorities), _Fixed(priorities))
    ]
    logs: list[list[tuple[str, str, float]]] = [[], []]
    actions = []
    now, queued, placed = 0.0, [], []
    for step in range(300):
        now += rng.choice([0.0, 0.5, 1.0])  # equal arrival times happen
        roll = rng.random()
        if roll < 0.55:
            actions.append(("submit", f"r{step}", rng.choice(["a", "b"]), now))
            queued.append(f"r{step}")
        elif roll < 0.65 and queued:
            rid = queued.pop(rng.randrange(len(queued)))
            actions.append(("cancel", rid, "", now))
            if rng.random() < 0.5:  # the same id comes back, later
                actions.append(("submit", rid, "a", now))
                queued.append(rid)
        elif placed:
            actions.append(("complete", placed.pop(rng.randrange(len(placed))), "", now))
        actions.append(("dispatch", "", "", now))
        # Both schedulers see the same actions; placements are tracked from the first one.
        for index, sched in enumerate(schedulers):
            for kind, rid, model, at in actions:
                if kind == "submit":
                    if not sched.workers():
                        for w in range(3):
                            sched.update_worker(WorkerReport(f"w{w}", "a" if w < 2 else "b", "x", max_batch=2), at)
                    sched.submit(QueuedRequest(rid, "t", model, at), now=at)
                elif kind == "cancel":
                    sched.cancel(rid)
                elif kind == "complete":
                    sched.complete(rid)
                else:
                    decisions = sched.dispatch(at)
                    logs[index] += [(d.request_id, d.worker.worker_id, d.base_priority) for d in decisions]
                    if index == 0:
                        for d in decisions:
                            queued.remove(d.request_id)
                            placed.append(d.request_id)
                sched.check_integrity()
        actions.clear()
    assert logs[0] == logs[1] and len(logs[0]) > 50
