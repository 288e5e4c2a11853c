"""Aragog's routing policies (seeds/002 §3.1 budget, §3.2 scheduler, §5.1 baselines) driving a real
``GlobalScheduler`` with a model group of three models."""

from __future__ import annotations

import dataclasses

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import GroupWorkflow, ModelGroup, ModelGroups
from clairvoyant.policy import PRESETS
from clairvoyant.policy.aragog import (
    AgentGraph,
    AragogRouting,
    EngineProfile,
    MetaQueue,
    PerInputRouting,
    PerWorkflowRouting,
    StageScheduler,
)
from clairvoyant.policy.aragog.pruning import prune_search
from clairvoyant.policy.aragog.routers import KnownSetsRouter
from clairvoyant.policy.scheduling import FcfsPriority
from clairvoyant.scheduler.core import Decision, GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit

COSTS = {"small": 1.0, "mid": 2.0, "large": 3.0}
MODELS = tuple(COSTS)
PAIR = ConfigSpace("pair", ("plan", "act"), (MODELS, MODELS))
DAG = ConfigSpace("dag", ("root", "plan", "act", "check", "draft"), (("large",),) * 5)
GROUPS = ModelGroups(
    {"auto": ModelGroup("auto", COSTS, {"pair": GroupWorkflow(PAIR), "dag": GroupWorkflow(DAG)})}
)


def pair(plan: str, act: str) -> int:
    return PAIR.config_of({"plan": plan, "act": act})


def mask_of(configs: list[int]) -> int:
    return sum(1 << c for c in set(configs))


# Accurate sets by input text, all upward closed (accuracy is monotone under upgrades, §3.1)
LEVEL = {m: i for i, m in enumerate(MODELS)}
SUM3 = mask_of([c for c in range(PAIR.size) if sum(PAIR.levels(c)) >= 3])  # mid+large, large+mid, large+large
SETS = {"any": PAIR.everything, "sum3": SUM3, "none": 0}
ROUTERS = {("auto", "pair"): KnownSetsRouter(SETS)}  # an unknown text keeps only the reference


def call(
    request_id: str, workflow: str | None, agent: str = "plan", *, text: str = "any", parents: tuple[str, ...] = (),
    workflow_type: str = "pair", end: bool | None = None, now: float = 0.0,
) -> QueuedRequest:  # fmt: skip
    meta = None if workflow is None else AppMetadata(workflow_type, workflow, agent, parent_request_ids=parents,
                                                     workflow_end=end)  # fmt: skip
    return QueuedRequest(request_id, "t", "auto", now, app_metadata=meta, input_text=text)


def cluster(policy: StageScheduler, batches: dict[str, int] | None = None) -> GlobalScheduler:
    sched = GlobalScheduler(FcfsPriority(), policy)
    for model, batch in (batches or {"small": 1, "mid": 1, "large": 1}).items():
        sched.update_worker(WorkerReport(f"w-{model}", model, "x:1", max_batch=batch), now=0.0)
    return sched


def step(sched: GlobalScheduler, now: float, *requests: QueuedRequest) -> list[Decision]:
    for request in requests:
        sched.submit(dataclasses.replace(request, arrival_time=now), now)
    decisions = sched.dispatch(now)
    sched.wake_at(now)  # as the simulator does after each dispatch
    sched.check_integrity()
    policy = sched.routing_policy
    assert isinstance(policy, StageScheduler)
    policy.check_integrity()
    return decisions


def placed(decisions: list[Decision]) -> list[tuple[str, str]]:
    return [(d.request_id, d.worker.model) for d in decisions]


def test_calls_spread_to_dearer_models_when_the_cheap_one_is_full() -> None:
    sched = cluster(AragogRouting(GROUPS, ROUTERS))
    decisions = step(sched, 0.0, *(call(f"c{i}", f"w{i}") for i in range(4)))
    assert placed(decisions) == [("c0", "small"), ("c1", "mid"), ("c2", "large")]
    assert [r.model for r in sched.placed_requests("w-mid")] == ["mid"]  # placed as its worker's model
    assert sched.queue_depth("auto") == 1


def test_profiled_gains_choose_the_engine_with_the_higher_marginal_throughput() -> None:
    profiles = {
        "small": EngineProfile("small", 2, (0.0, 10.0, 12.0)),  # gains 10 then 2
        "mid": EngineProfile("mid", 2, (0.0, 6.0, 12.0)),  # gains 6 then 6
        "large": EngineProfile("large", 1, (0.0, 3.0)),
    }
    sched = cluster(AragogRouting(GROUPS, ROUTERS, profiles), {"small": 4, "mid": 4, "large": 4})
    decisions = step(sched, 0.0, call("a", "wa"), call("b", "wb"))
    assert placed(decisions) == [("a", "small"), ("b", "mid")]  # U 16 beats 12 (both on small)
    # one more call each: small and mid saturate at 2 and large at 1, below max_batch (4); the
    # order is the highest gain first (mid 6, large 3, small 2), all three ranking U = 11
    decisions = step(sched, 0.0, *(call(f"c{i}", f"wc{i}") for i in range(4)))
    assert placed(decisions) == [("c0", "mid"), ("c1", "large"), ("c2", "small")]
    assert step(sched, 0.0) == []


def test_a_placement_prunes_its_workflows_set_for_the_later_stages() -> None:
    policy = AragogRouting(GROUPS, ROUTERS)
    sched = cluster(policy)
    assert placed(step(sched, 0.0, call("lone", None))) == [("lone", "large")]  # no app_metadata: c*'s model
    assert placed(step(sched, 1.0, call("plan1", "w1", text="sum3"))) == [("plan1", "mid")]  # large is full
    assert policy.configuration_set("auto", "t", "w1") == 1 << pair("mid", "large")
    assert sched.complete("plan1", now=2.0)
    # act may now run on large only: small and mid are free, and it waits
    assert step(sched, 2.0, call("act1", "w1", "act", text="sum3", parents=("plan1",))) == []
    assert sched.complete("lone", now=3.0)
    assert placed(step(sched, 3.0)) == [("act1", "large")]
    assert sched.complete("act1", now=4.0)
    # with large free, plan goes there: it keeps two of the three configurations (flexibility)
    assert placed(step(sched, 4.0, call("plan2", "w2", text="sum3"))) == [("plan2", "large")]
    assert policy.configuration_set("auto", "t", "w2") == (1 << pair("large", "mid")) | (1 << pair("large", "large"))


def test_look_ahead_skips_a_blocked_workflow_and_fifo_keeps_its_turn() -> None:
    sched = cluster(AragogRouting(GROUPS, ROUTERS), {"small": 1, "large": 1})
    step(sched, 0.0, call("lone", None))  # holds large
    # w1 may only run on large ("ref": its router verifies c* alone); w2 runs anywhere
    decisions = step(sched, 1.0, call("p1", "w1", text="ref"), call("p2", "w2"))
    assert placed(decisions) == [("p2", "small")]
    assert step(sched, 2.0, call("p3", "w3")) == []
    assert sched.complete("lone", now=3.0)
    assert placed(step(sched, 3.0)) == [("p1", "large")]  # not w3, which could also have used it


def test_ready_agents_of_one_request_go_deepest_first_and_requests_fifo() -> None:
    policy = AragogRouting(GROUPS, ROUTERS)
    sched = cluster(policy, {"large": 1})

    def run(request: QueuedRequest, now: float) -> None:
        assert placed(step(sched, now, request)) == [(request.request_id, "large")]
        assert sched.complete(request.request_id, now=now)

    # the first workflow teaches the graph: root -> plan -> act -> check, root -> draft
    for i, (agent, parent) in enumerate([("root", ""), ("plan", "r"), ("act", "p"), ("check", "a"), ("draft", "r")]):
        parents = (f"w1-{parent}",) if parent else ()
        run(call(f"w1-{agent[0]}", "w1", agent, parents=parents, workflow_type="dag"), float(i))
    assert [policy.graph.depth("dag", a) for a in DAG.agents] == [3, 2, 1, 0, 0]
    run(call("w2-r", "w2", "root", workflow_type="dag"), 10.0)
    sched.submit(call("w2-d", "w2", "draft", parents=("w2-r",), workflow_type="dag"), 11.0)
    sched.submit(call("w2-p", "w2", "plan", parents=("w2-r",), workflow_type="dag"), 11.0)
    assert placed(step(sched, 11.0)) == [("w2-p", "large")]  # deeper, though it arrived second
    assert sched.complete("w2-p", now=12.0)
    assert placed(step(sched, 12.0)) == [("w2-d", "large")]
    assert sched.complete("w2-d", now=13.0)
    # across requests FIFO wins over depth: w3 arrived before w4, so its draft beats w4's root
    assert placed(step(sched, 13.0, call("w3-r", "w3", "root", workflow_type="dag"),
                      call("w4-r", "w4", "root", workflow_type="dag"))) == [("w3-r", "large")]  # fmt: skip
    assert sched.complete("w3-r", now=14.0)
    decisions = step(sched, 14.0, call("w3-d", "w3", "draft", parents=("w3-r",), workflow_type="dag"))
    assert placed(decisions) == [("w3-d", "large")]


def test_given_depths_win_over_the_learned_graph() -> None:
    sched = cluster(AragogRouting(GROUPS, ROUTERS, depths={("dag", "draft"): 5, ("dag", "plan"): 1}), {"large": 1})
    step(sched, 0.0, call("lone", None))
    step(sched, 0.0, call("p", "w", "plan", workflow_type="dag"), call("d", "w", "draft", workflow_type="dag"))
    assert sched.complete("lone", now=1.0)
    assert placed(step(sched, 1.0)) == [("d", "large")]


def test_the_first_call_waits_for_the_budgeted_search_then_runs_on_what_it_verified() -> None:
    policy = AragogRouting(GROUPS, ROUTERS, router_call_s=0.01)  # budget 45 ms: 4 router calls
    sched = cluster(policy)
    full = prune_search(PAIR, ROUTERS[("auto", "pair")], "sum3")
    assert full.calls > 4  # the budget cuts this search short
    verified = full.verified(4)
    assert step(sched, 0.0, call("p", "w", text="sum3")) == []
    assert sched.wake_at(0.0) == pytest.approx(0.04)
    assert step(sched, 0.02) == []  # every worker is free: the search is still running
    assert sched.wake_at(0.02) == pytest.approx(0.04)
    assert policy.configuration_set("auto", "t", "w") == (verified or 1 << PAIR.reference)
    decisions = step(sched, 0.04)
    assert [d.request_id for d in decisions] == ["p"]
    assert decisions[0].worker.model in PAIR.viable_models(verified or 1 << PAIR.reference, "plan")
    assert policy.queue_ema_s == pytest.approx(0.04) and policy.budget_s() == pytest.approx(0.045)
    assert sched.wake_at(0.04) is None
    assert policy.routing_stats() == pytest.approx({
        "workflows": 1, "routing_ms_mean": 40.0, "router_calls_mean": 4, "cut_short_fraction": 1.0,
        "hidden_fraction": 0.0,  # it ran the moment its search ended: the search delayed it
    })  # fmt: skip


def test_a_long_queue_buys_a_longer_search_and_nothing_verified_means_the_reference() -> None:
    policy = AragogRouting(GROUPS, ROUTERS, router_call_s=0.01, queue_ema_alpha=1.0)
    sched = cluster(policy, {"large": 1})
    step(sched, 0.0, call("lone", None))
    step(sched, 0.0, call("p1", "w1", text="none"))  # nothing accurate: c* only
    assert policy.configuration_set("auto", "t", "w1") == 1 << PAIR.reference
    assert sched.complete("lone", now=0.5)
    assert placed(step(sched, 0.5)) == [("p1", "large")]  # it waited 0.5 s: the EMA (alpha 1) is 0.5
    assert policy.budget_s() == pytest.approx(0.5)
    assert policy.routing_stats()["hidden_fraction"] == 1.0  # queueing outlasted its 40 ms search
    full = prune_search(PAIR, ROUTERS[("auto", "pair")], "sum3")
    step(sched, 1.0, call("p2", "w2", text="sum3"))  # 50 calls allowed: the whole search
    assert policy.configuration_set("auto", "t", "w2") == SUM3 == full.verified()
    assert sched.wake_at(1.0) == pytest.approx(1.0 + full.calls * 0.01)


def test_a_budget_below_one_router_call_leaves_the_reference_at_once() -> None:
    policy = AragogRouting(GROUPS, ROUTERS, router_call_s=0.01, min_budget_s=0.005)
    sched = cluster(policy)
    assert placed(step(sched, 0.0, call("p", "w"))) == [("p", "large")]
    assert policy.configuration_set("auto", "t", "w") == 1 << PAIR.reference
    assert sched.wake_at(0.0) is None


def test_per_input_baseline_fixes_the_cheapest_accurate_configuration() -> None:
    policy = PerInputRouting(GROUPS, ROUTERS)
    sched = cluster(policy)
    # sum3: mid+large and large+mid both cost 5; the smaller index wins (plan large, act mid)
    assert pair("large", "mid") < pair("mid", "large")
    assert placed(step(sched, 0.0, call("p", "w", text="sum3"))) == [("p", "large")]
    assert policy.configuration_set("auto", "t", "w") == 1 << pair("large", "mid")
    assert placed(step(sched, 0.0, call("q", "v", text="any"))) == [("q", "small")]
    assert sched.wake_at(0.0) is None  # no routing time
    assert sched.complete("p", now=1.0)
    assert placed(step(sched, 1.0, call("a", "w", "act", text="sum3", parents=("p",)))) == [("a", "mid")]


def test_per_workflow_baseline_runs_one_configuration_per_type() -> None:
    policy = PerWorkflowRouting(GROUPS, fixed={("auto", "pair"): pair("small", "mid")})
    sched = cluster(policy)
    assert placed(step(sched, 0.0, call("p", "w", text="sum3"))) == [("p", "small")]
    assert placed(step(sched, 0.0, call("r", "x", "root", workflow_type="dag"))) == [("r", "large")]  # default c*
    assert policy.configuration_set("auto", "t", "x") == 1 << DAG.reference
    assert step(sched, 0.0, call("p2", "w2")) == []  # small is full and the type's one configuration needs it


@pytest.mark.parametrize(
    "request_",
    [call("u", "w", workflow_type="unknown"), call("u", "w", "nobody"), call("u", None)],
    ids=["unknown workflow type", "unknown agent", "no app_metadata"],
)
def test_calls_the_group_does_not_describe_run_on_the_reference_model_only(request_: QueuedRequest) -> None:
    sched = cluster(AragogRouting(GROUPS, ROUTERS), {"small": 2, "large": 1})
    step(sched, 0.0, call("lone", None))  # holds large
    assert step(sched, 0.0, request_) == []  # small is free, but not for it
    assert sched.complete("lone", now=1.0)
    assert placed(step(sched, 1.0)) == [("u", "large")]


def test_workflows_are_forgotten_when_they_end_or_idle_past_the_ttl() -> None:
    policy = AragogRouting(GROUPS, ROUTERS, workflow_idle_ttl_s=10.0)
    sched = cluster(policy, {"small": 2000, "large": 1000})
    for i in range(500):  # ended workflows and lone calls leave nothing behind
        step(sched, 0.0, call(f"p{i}", f"e{i}"))
        step(sched, 0.0, call(f"a{i}", f"e{i}", "act", parents=(f"p{i}",), end=True), call(f"l{i}", None))
    assert policy.tracked_workflows == 0
    step(sched, 1.0, call("p", "early"))
    step(sched, 5.0, call("q", "later"))
    assert policy.tracked_workflows == 2
    step(sched, 10.5)
    assert policy.tracked_workflows == 2  # 'early' has had no call queued since 1.0: forgotten from 11.0
    step(sched, 11.0)
    assert policy.tracked_workflows == 1 and policy.configuration_set("auto", "t", "early") is None
    step(sched, 15.0)
    assert policy.tracked_workflows == 0
    # a cancelled call leaves its workflow idle too
    sched.submit(call("c", "cancelled"), 16.0)
    assert policy.tracked_workflows == 1
    assert sched.cancel("c")
    policy.check_integrity()
    step(sched, 25.9)
    assert policy.tracked_workflows == 1
    step(sched, 26.0)
    assert policy.tracked_workflows == 0


@pytest.mark.parametrize("preset", ["aragog", "aragog-per-input", "aragog-per-workflow"])
def test_each_preset_builds_without_arguments_as_fcfs_with_least_used_routing(preset: str) -> None:
    assert PRESETS.create(preset) == ("fcfs", preset, "lru", "static")
    sched = GlobalScheduler.from_preset(preset)
    for worker in ("a", "b"):
        sched.update_worker(WorkerReport(worker, "m", "x:1", max_batch=2), now=0.0)
    for i in range(5):
        sched.submit(QueuedRequest(f"r{i}", "t", "m", float(i)), now=float(i))
    decisions = sched.dispatch(5.0)
    sched.check_integrity()
    assert [(d.request_id, d.worker_id) for d in decisions] == [("r0", "a"), ("r1", "b"), ("r2", "a"), ("r3", "b")]
    assert sched.wake_at(5.0) is None


def test_the_agent_graph_ignores_back_edges_and_given_depths_win() -> None:
    graph = AgentGraph()
    graph.observe("self_refine", "generate", [])
    graph.observe("self_refine", "critique", ["generate"])
    graph.observe("self_refine", "refine", ["critique"])
    graph.observe("self_refine", "critique", ["refine"])  # the loop's back edge: ignored
    graph.observe("self_refine", "refine", ["refine"])
    assert [graph.depth("self_refine", a) for a in ("generate", "critique", "refine", "unknown")] == [2, 1, 0, 0]
    graph.observe("self_refine", "summary", ["generate", "refine"])  # a new leaf deepens the rest
    assert [graph.depth("self_refine", a) for a in ("generate", "critique", "refine", "summary")] == [3, 2, 1, 0]
    fixed = AgentGraph({("self_refine", "refine"): 7})
    fixed.observe("self_refine", "refine", ["generate"])
    assert (fixed.depth("self_refine", "refine"), fixed.depth("self_refine", "generate")) == (7, 0)


def test_the_meta_queue_walks_only_buckets_with_a_free_model_in_order() -> None:
    queue = MetaQueue()
    queue.add("a", (0, -2, 0), frozenset({"small", "mid"}))
    queue.add("c", (1, 0, 4), frozenset({"large"}))
    queue.add("d", (2, -1, 5), frozenset({"small"}))
    queue.add("f", (3, 0, 9), frozenset({"small", "mid"}))
    queue.add("b", (0, -1, 1), frozenset({"large"}))
    queue.check_integrity()
    assert list(queue.walk({"large", "mid"})) == ["a", "b", "c", "f"]
    assert list(queue.walk({"small"})) == ["a", "d", "f"]
    assert list(queue.walk({"other"})) == []
    queue.move("f", frozenset({"large"}))  # its workflow's set shrank; it keeps its place
    assert list(queue.walk({"large"})) == ["b", "c", "f"]
    assert queue.remove("b") and not queue.remove("b")
    assert len(queue) == 4 and "b" not in queue
    queue.check_integrity()
    with pytest.raises(ValueError, match="already"):
        queue.add("a", (9, 0, 9), frozenset({"small"}))

