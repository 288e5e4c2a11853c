"""Ayo-style topology-depth priority (Kairos's baseline, seeds/004 §2.2.2, §7.1) with round robin."""

from __future__ import annotations

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy.topo import TopoDepthPriority
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, ProcessTable, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit


def call(
    rid: str, workflow: str | None = "w", parents: tuple[str, ...] = (), arrival: float = 0.0
) -> QueuedRequest:
    meta = None if workflow is None else AppMetadata("type", workflow, "agent", parent_request_ids=parents)
    return QueuedRequest(rid, "t", "m", arrival, app_metadata=meta)


def test_preset_is_depth_priority_with_round_robin() -> None:
    assert PRESETS.create("topo-depth")[:2] == ("topo-depth", "round-robin")


def test_depth_is_one_more_than_the_deepest_known_parent() -> None:
    policy = TopoDepthPriority()
    table = ProcessTable()
    policy.bind_programs(table)

    def submitted(request: QueuedRequest) -> float:
        table.on_submit(request, 0.0)
        return policy.priority(request, 0.0)

    assert submitted(call("a")) == 0.0
    assert submitted(call("b", parents=("a",))) == 1.0
    assert submitted(call("c", parents=("a", "b"))) == 2.0  # a DAG join: the longer path
    assert submitted(call("d", parents=("never-seen",))) == 1.0  # an unknown parent is a root
    assert submitted(call("b", workflow="other")) == 0.0  # depths are per program
    assert submitted(call("x", workflow=None, parents=())) == 0.0


def test_deeper_calls_first_then_fcfs_and_round_robin() -> None:
    sched = GlobalScheduler.from_preset("topo-depth")
    for w in ("w0", "w1"):
        sched.update_worker(WorkerReport(w, "m", "a", max_batch=1), 0.0)
    sched.submit(call("p/0", "p"), 0.0)
    assert [(d.request_id, d.worker_id) for d in sched.dispatch(0.0)] == [("p/0", "w0")]
    sched.complete("p/0", now=1.0)
    sched.submit(call("q/0", "q", arrival=1.0), 1.0)
    sched.submit(call("r/0", "r", arrival=1.5), 1.5)
    sched.submit(call("p/1", "p", parents=("p/0",), arrival=2.0), 2.0)
    decisions = sched.dispatch(2.0)
    assert [(d.request_id, d.worker_id, d.base_priority) for d in decisions] == [
        ("p/1", "w1", 1.0),  # depth 1 overtakes the earlier roots
        ("q/0", "w0", 0.0),  # then roots in arrival order
    ]
    sched.check_integrity()
