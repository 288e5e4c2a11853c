"""The industry baselines: session affinity and re-pinning, sglang's imbalance switch and cache
threshold, Continuum's program-level FCFS."""

from __future__ import annotations

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy.baselines import (
    ApproximateTrees,
    CacheAwareConfig,
    CacheAwareRouting,
    ProgramFcfsPriority,
)
from clairvoyant.scheduler.core import PRESETS, GlobalScheduler, QueuedRequest, WorkerReport, WorkerView

pytestmark = pytest.mark.unit


def call(rid: str, session: str | None, t: float, prompt: int = 100, tenant: str = "t") -> QueuedRequest:
    meta = None if session is None else AppMetadata("wf", session, "agent")
    return QueuedRequest(rid, tenant, "m", t, prompt_tokens=prompt, max_tokens=8, app_metadata=meta)


def scheduler(preset: str, workers: int, max_batch: int = 4) -> GlobalScheduler:
    sched = GlobalScheduler.from_preset(preset)
    for i in range(workers):
        sched.update_worker(WorkerReport(f"w{i}", "m", f"w{i}:1", max_batch=max_batch), now=0.0)
    return sched


def place(sched: GlobalScheduler, request: QueuedRequest) -> str | None:
    sched.submit(request, now=request.arrival_time)
    decisions = sched.dispatch(request.arrival_time)
    sched.check_integrity()
    return decisions[0].worker_id if decisions else None


def view(worker_id: str, placed: int = 0, *, draining: bool = False) -> WorkerView:
    return WorkerView(
        worker_id=worker_id, model="m", address="", http_address="", running=0, queued=0, placed=placed,
        max_batch=32, kv_blocks_used=0, kv_blocks_total=0, max_model_len=0, draining=draining,
        last_heartbeat=0.0, heartbeat_interval_s=1.0, admission_limit=256,
    )  # fmt: skip


def test_baseline_presets_are_registered() -> None:
    assert PRESETS.create("vllm-prodstack")[:2] == ("fcfs", "session-affinity")
    assert PRESETS.create("sglang-gw")[:2] == ("fcfs", "sglang-cache-aware")
    assert PRESETS.create("continuum")[:2] == ("program-fcfs", "session-affinity")
    assert [w.admission_limit for w in scheduler("vllm-prodstack", 1).workers()] == [32]  # 8 x max_batch


# ---- session affinity (vllm-prodstack, continuum) -----------------------------------------------


@pytest.mark.parametrize("preset", ["vllm-prodstack", "continuum"])
def test_a_session_sticks_to_its_worker_and_new_sessions_go_to_the_least_loaded(preset: str) -> None:
    sched = scheduler(preset, 3)
    assert place(sched, call("a1", "A", 1.0)) == "w0"  # all idle: the smallest id
    assert place(sched, call("b1", "B", 2.0)) == "w1"
    assert place(sched, call("a2", "A", 3.0)) == "w0"  # pinned, although w2 is idle
    assert place(sched, call("a3", "A", 4.0)) == "w0"
    assert place(sched, call("c1", "C", 5.0)) == "w2"
    assert place(sched, call("x1", None, 6.0)) == "w1"  # no session: least loaded (w1 and w2 hold 1)
    assert place(sched, call("ob1", "B", 7.0, tenant="other")) == "w2"  # another tenant's B is a new session
    assert sched.programs.get(("t", "A")) is not None
    assert sched.programs.get(("t", "A")).engine_id == "w0"  # type: ignore[union-attr]


def test_sessions_re_pin_when_their_worker_is_gone_or_draining() -> None:
    sched = scheduler("vllm-prodstack", 3)
    assert [place(sched, call(f"{s}1", s, t)) for s, t in (("A", 1.0), ("B", 2.0), ("C", 3.0))] == ["w0", "w1", "w2"]
    assert place(sched, call("x", None, 3.5)) == "w0"  # w0 now holds 2
    # w1 goes silent and expires; w0 and w2 report on.
    for wid in ("w0", "w2"):
        sched.update_worker(WorkerReport(wid, "m", f"{wid}:1", max_batch=4), now=10.0)
    assert [e.worker_id for e in sched.expire_workers(10.0)] == ["w1"]
    assert place(sched, call("b2", "B", 10.0)) == "w2"  # least loaded of w0 (2) and w2 (1)
    assert sched.programs.get(("t", "B")).engine_id == "w2"  # type: ignore[union-attr]
    assert place(sched, call("b3", "B", 11.0)) == "w2"  # the new pin holds
    sched.drain("w2")
    assert place(sched, call("b4", "B", 12.0)) == "w0"  # draining: re-pinned to the only one left
    assert place(sched, call("c2", "C", 13.0)) == "w0"
    assert sched.programs.get(("t", "C")).engine_id == "w0"  # type: ignore[union-attr]


def test_a_call_waits_for_its_pinned_worker_when_it_is_full() -> None:
    sched = scheduler("vllm-prodstack", 2, max_batch=1)  # admission limit 8 each
    assert place(sched, call("a0", "A", 0.0)) == "w0"
    for i in range(7):
        assert place(sched, call(f"f{i}", f"F{i}", 0.1 * (i + 1))) == ("w1" if i % 2 == 0 else "w0")
    assert [w.placed for w in sched.workers()] == [4, 4]
    for i in range(4):
        assert place(sched, call(f"a{i + 1}", "A", 1.0 + i)) == "w0"
    assert [w.placed for w in sched.workers()] == [8, 4]
    assert place(sched, call("a5", "A", 6.0)) is None  # w0 at its limit: wait, w1 has room
    assert sched.complete("a0")
    assert [(d.request_id, d.worker_id) for d in sched.dispatch(7.0)] == [("a5", "w0")]


# ---- cache-aware routing (sglang-gw) --------------------------------------------------------------


def routed_history(router: CacheAwareRouting, history: dict[str, list[tuple[str, int]]]) -> None:
    """Put (session, prompt tokens) entries in each worker's approximate tree."""
    for worker_id, entries in history.items():
        for session, tokens in entries:
            router.trees.insert(worker_id, ("t", session), tokens)


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ((64, 0), "w0"),  # max - min = 64, not > 64: balanced, the session's match wins
        ((65, 0), "w1"),  # 65 > 64 and 65 > 1.5 x 0: imbalanced, the least loaded
        ((195, 130), "w0"),  # 65 > 64 but 195 = 1.5 x 130, not above: balanced
        ((196, 130), "w1"),  # 66 > 64 and 196 > 195: imbalanced
        ((60, 0), "w0"),  # 60 > 1.5 x 0 but 60 apart, not > 64: balanced
    ],
)
def test_the_imbalance_switch_uses_sglangs_thresholds(loads: tuple[int, int], expected: str) -> None:
    router = CacheAwareRouting()
    assert router.config == CacheAwareConfig(0.3, 64, 1.5, 2**26)
    routed_history(router, {"w0": [("S", 100)]})
    workers = [view("w0", loads[0]), view("w1", loads[1])]
    assert router.route(call("r", "S", 1.0, prompt=120), workers, 1.0) == expected
    assert router.trees.matches(("t", "S"))[expected] == 120  # the chosen worker's tree grows
    router.trees.check_integrity()


def test_an_imbalanced_route_still_grows_the_chosen_workers_tree() -> None:
    router = CacheAwareRouting()
    routed_history(router, {"w0": [("S", 100)]})
    assert router.route(call("r", "S", 1.0, prompt=120), [view("w0", 65), view("w1", 0)], 1.0) == "w1"
    assert router.trees.matches(("t", "S")) == {"w0": 100, "w1": 120}
    assert (router.trees.size("w0"), router.trees.size("w1")) == (100, 120)
    # Balanced again: the best match is now w1 (120 of 130 tokens), the most recent holder.
    assert router.route(call("r2", "S", 2.0, prompt=130), [view("w0", 1), view("w1", 1)], 2.0) == "w1"


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        (100, "w1"),  # 30 / 100 = 0.3, not above the threshold: the smallest tree (w1: 100 < 530)
        (99, "w0"),  # 30 / 99 = 0.303 > 0.3: the matching worker, although its tree is larger
        (30, "w0"),  # a full match
    ],
)
def test_the_cache_threshold_is_0_3_and_below_it_the_smallest_tree_wins(prompt: int, expected: str) -> None:
    router = CacheAwareRouting()
    routed_history(router, {"w0": [("S", 30), ("X", 500)], "w1": [("Y", 100)]})
    workers = [view("w0"), view("w1")]
    assert router.match_rate(call("r", "S", 1.0, prompt=prompt), "w0") == pytest.approx(min(30, prompt) / prompt)
    assert router.route(call("r", "S", 1.0, prompt=prompt), workers, 1.0) == expected


def test_a_session_without_history_and_a_request_without_one_go_to_the_smallest_tree() -> None:
    router = CacheAwareRouting()
    routed_history(router, {"w0": [("X", 500)], "w1": [("Y", 100)], "w2": [("Z", 300)]})
    workers = [view("w0"), view("w1", placed=3), view("w2")]
    assert router.route(call("new", "N", 1.0, prompt=50), workers, 1.0) == "w1"  # size 100, despite its load
    assert router.route(call("anon", None, 2.0, prompt=500), workers, 2.0) == "w1"  # 150 still smallest
    assert router.trees.size("w1") == 650  # the anonymous prompt is an entry nothing will match
    assert router.route(call("n2", "N", 3.0, prompt=60), workers, 3.0) == "w1"  # 50/60 matches on w1


def test_a_full_matching_worker_makes_the_call_wait_and_a_draining_one_does_not_match() -> None:
    router = CacheAwareRouting()
    routed_history(router, {"w0": [("S", 100)], "w1": [("Y", 10)]})
    full = [view("w0", 256), view("w1", 200)]  # balanced (56 apart), w0 at its admission limit
    assert router.route(call("r", "S", 1.0, prompt=100), full, 1.0) is None
    draining = [view("w0", draining=True), view("w1")]
    assert router.route(call("r", "S", 1.0, prompt=100), draining, 1.0) == "w1"
    # A worker that leaves takes its tree with it.
    assert router.route(call("r2", "S", 2.0, prompt=100), [view("w1")], 2.0) == "w1"
    assert router.trees.workers() == ["w1"]
    router.trees.check_integrity()


def test_approximate_trees_evict_the_least_recently_routed_entry_past_their_bound() -> None:
    trees = ApproximateTrees(max_tree_tokens=100)
    trees.insert("w0", "a", 60)
    trees.insert("w0", "b", 30)
    trees.insert("w0", "a", 70)  # a grows by 10 and becomes the most recent
    assert trees.size("w0") == 100
    trees.insert("w0", "c", 20)  # 120 > 100: b (least recent) goes
    assert (trees.size("w0"), trees.matches("b"), trees.matches("a")) == (90, {}, {"w0": 70})
    trees.insert("w0", "a", 50)  # a shorter prompt of the same session adds nothing
    assert trees.size("w0") == 90
    trees.check_integrity()


# ---- program-level FCFS (continuum) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "order"),
    [("continuum", ["a1", "a2", "a3", "b1"]), ("vllm-prodstack", ["a1", "b1", "a2", "a3"])],
)
def test_calls_rank_by_their_programs_first_arrival(preset: str, order: list[str]) -> None:
    sched = scheduler(preset, 1, max_batch=1)  # admission limit 8
    for i in range(8):
        assert place(sched, call(f"f{i}", None, 0.0)) == "w0"  # fill the worker: the rest queue
    for request in (call("a1", "A", 1.0), call("b1", "B", 2.0), call("a2", "A", 3.0), call("a3", "A", 4.0)):
        assert place(sched, request) is None
    placed: list[str] = []
    for i in range(4):
        assert sched.complete(f"f{i}")
        decisions = sched.dispatch(5.0 + i)
        placed += [d.request_id for d in decisions]
        if preset == "continuum" and decisions[0].request_id.startswith("a"):
            assert decisions[0].base_priority == -1.0  # A's first arrival
    assert placed == order


def test_program_fcfs_keeps_a_finished_first_call_s_arrival_and_forgets_ended_programs() -> None:
    sched = scheduler("continuum", 1, max_batch=1)
    assert place(sched, call("a1", "A", 1.0)) == "w0"
    assert sched.complete("a1", now=1.5)  # A's first call is done; A stays in the process table
    for i in range(7):
        assert place(sched, call(f"f{i}", None, 2.0)) == "w0"
    assert place(sched, call("z", "Z", 2.0)) == "w0"  # the worker's eighth placement
    assert place(sched, call("b1", "B", 3.0)) is None
    assert place(sched, call("a2", "A", 4.0)) is None
    assert sched.complete("f0")
    assert [d.request_id for d in sched.dispatch(5.0)] == ["a2"]  # ranks at A's arrival, 1.0
    priority = sched.priority_policy
    assert isinstance(priority, ProgramFcfsPriority)
    # The first arrival lives in the process table's entry: a program that ended and comes back
    # starts afresh, and the policy keeps nothing per program that could outgrow the table.
    assert sched.complete("a2", now=6.0) and sched.end_workflow("t", "A")
    assert priority.priority(call("a3", "A", 7.0), 7.0) == -7.0
    sched.submit(call("a3", "A", 7.0), now=7.0)
    assert priority.priority(call("a4", "A", 8.0), 8.0) == -7.0
    assert not hasattr(priority, "_first_arrival")
