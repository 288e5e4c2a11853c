"""The global scheduler with a model group: a ``ModelAssigning`` routing policy places the group's
calls on workers of any of its models (the hook Aragog's presets use), and the scheduler holds it
to the hook's contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import NoWorkers
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.scheduling import Assignment, FcfsPriority, least_used_eligible
from clairvoyant.scheduler.core import GlobalScheduler, QueuedRequest, WorkerReport, WorkerView

pytestmark = pytest.mark.unit

GROUP = "auto"
MEMBERS = frozenset({"small", "large"})


class FirstFit:
    """Places its group's calls in queue order on the first worker (by id) of a member model that
    has room; records what the scheduler told it."""

    capabilities = frozenset({Capability.ASSIGNS_MODELS})

    def __init__(self) -> None:
        self.queue: list[str] = []
        self.told: list[tuple[str, str]] = []

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        best = least_used_eligible(request, workers)
        return None if best is None else best.worker_id

    def group_models(self) -> Mapping[str, frozenset[str]]:
        return {GROUP: MEMBERS}

    def queued(self, request: QueuedRequest, now: float) -> None:
        self.queue.append(request.request_id)
        self.told.append(("queued", request.request_id))

    def unqueued(self, request_id: str) -> None:
        self.queue.remove(request_id)
        self.told.append(("unqueued", request_id))

    def assign(self, group: str, workers: Sequence[WorkerView], now: float) -> list[Assignment]:
        room = {
            w.worker_id: (w.admission_limit or w.max_batch) - w.placed
            for w in workers
            if w.model in MEMBERS and not w.draining
        }
        assignments = []
        for request_id in list(self.queue):
            worker_id = next((w for w in sorted(room) if room[w] > 0), None)
            if worker_id is None:
                break
            room[worker_id] -= 1
            self.queue.remove(request_id)
            assignments.append(Assignment(request_id, worker_id))
        return assignments


class Rogue(FirstFit):
    """Answers ``assign`` with a fixed list, whatever it is."""

    def __init__(self, answer: list[Assignment]) -> None:
        super().__init__()
        self.answer = answer

    def assign(self, group: str, workers: Sequence[WorkerView], now: float) -> list[Assignment]:
        return self.answer


def group_call(request_id: str, agent: str = "plan") -> QueuedRequest:
    return QueuedRequest(request_id, "t", GROUP, 0.0, app_metadata=AppMetadata("pair", "w1", agent))


def cluster(policy: FirstFit, workers: Mapping[str, tuple[str, int]]) -> GlobalScheduler:
    sched = GlobalScheduler(FcfsPriority(), policy)
    for worker_id, (model, batch) in workers.items():
        sched.update_worker(WorkerReport(worker_id, model, "x:1", max_batch=batch), now=0.0)
    return sched


def test_group_calls_are_placed_as_calls_of_their_workers_model() -> None:
    policy = FirstFit()
    sched = cluster(policy, {"a-large": ("large", 1), "b-small": ("small", 1), "c-other": ("other", 4)})
    for i in range(3):
        sched.submit(group_call(f"g{i}", agent=f"agent{i}"), now=0.0)
    sched.submit(QueuedRequest("plain", "t", "other", 0.0), now=0.0)
    assert policy.told == [("queued", "g0"), ("queued", "g1"), ("queued", "g2")]  # not the plain call
    decisions = sched.dispatch(1.0)
    sched.check_integrity()
    assert sorted((d.request_id, d.worker_id, d.worker.model) for d in decisions) == [
        ("g0", "a-large", "large"),
        ("g1", "b-small", "small"),
        ("plain", "c-other", "other"),
    ]
    assert [r.model for r in sched.placed_requests("b-small")] == ["small"]
    assert sched.agent_model("pair", "agent0") == "large" and sched.agent_model("pair", "agent1") == "small"
    assert sched.queue_depth(GROUP) == 1 and policy.queue == ["g2"]
    assert sched.complete("g0", "a-large", now=2.0)
    assert [(d.request_id, d.worker_id) for d in sched.dispatch(2.0)] == [("g2", "a-large")]
    sched.check_integrity()


def test_a_cancelled_group_call_is_unqueued() -> None:
    policy = FirstFit()
    sched = cluster(policy, {"s": ("small", 1)})
    sched.submit(group_call("g0"), now=0.0)
    sched.submit(group_call("g1"), now=0.0)
    assert sched.cancel("g1")
    assert policy.told[-1] == ("unqueued", "g1") and policy.queue == ["g0"]
    assert not sched.cancel("g1")
    assert [d.request_id for d in sched.dispatch(0.0)] == ["g0"]
    sched.check_integrity()


def test_no_worker_of_any_group_model_is_no_workers() -> None:
    sched = cluster(FirstFit(), {"o": ("other", 1)})
    with pytest.raises(NoWorkers):
        sched.submit(group_call("g0"), now=0.0)
    sched.update_worker(WorkerReport("s", "small", "x:1", max_batch=1), now=0.0)
    sched.submit(group_call("g0"), now=0.0)  # one member model suffices
    assert sched.queue_depth(GROUP) == 1


def test_removing_the_last_worker_of_the_group_rejects_its_queue() -> None:
    policy = FirstFit()
    sched = cluster(policy, {"s": ("small", 1), "l": ("large", 1)})
    for i in range(4):
        sched.submit(group_call(f"g{i}"), now=0.0)
    assert [d.request_id for d in sched.dispatch(0.0)] == ["g0", "g1"]
    gone = sched.remove_worker("l")
    assert gone is not None and gone.failed_request_ids == ("g0",) and gone.rejected_request_ids == ()
    assert sched.queue_depth(GROUP) == 2  # small can still serve them
    gone = sched.remove_worker("s")
    assert gone is not None and gone.failed_request_ids == ("g1",)
    assert sorted(gone.rejected_request_ids) == ["g2", "g3"]
    assert policy.queue == [] and ("unqueued", "g2") in policy.told and ("unqueued", "g3") in policy.told
    sched.check_integrity()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([Assignment("g0", "o")], "a worker of a model outside the group"),
        ([Assignment("g0", "s"), Assignment("g1", "s")], "a worker with room for one"),
        ([Assignment("nobody", "s")], "a request that is not queued"),
        ([Assignment("plain", "s")], "a request of another queue"),
        ([Assignment("g0", "ghost")], "a worker that does not exist"),
    ],
)
def test_an_ineligible_assignment_raises(answer: list[Assignment], why: str) -> None:
    sched = cluster(Rogue(answer), {"s": ("small", 1), "o": ("other", 1)})
    sched.drain("o")  # the plain call waits in its queue
    sched.submit(group_call("g0"), now=0.0)
    sched.submit(group_call("g1"), now=0.0)
    sched.submit(QueuedRequest("plain", "t", "other", 0.0), now=0.0)
    with pytest.raises(RuntimeError, match="model-assigning policy"):
        sched.dispatch(0.0)


def test_an_excluded_worker_is_ineligible_for_the_call() -> None:
    sched = cluster(Rogue([Assignment("g0", "s")]), {"s": ("small", 1), "l": ("large", 1)})
    request = group_call("g0")
    sched.submit(QueuedRequest("g0", "t", GROUP, 0.0, app_metadata=request.app_metadata,
                               exclude_workers=frozenset({"s"})), now=0.0)  # fmt: skip
    with pytest.raises(RuntimeError, match="ineligible worker 's'"):
        sched.dispatch(0.0)
