"""The cache family's policies: which blocks each drops, retains, writes back and promotes, on the
workflow shapes the profiler predicts (chain, loop, fan-out, rework), and the numbers behind them."""

from __future__ import annotations

import math
import random

import pytest

from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.core.annotations import Confidence, NextAgent, ProjectedCalls, SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import chain_hashes, sequence_hashes
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy import CACHE_POLICIES, CacheDirective
from clairvoyant.policy.cache import BlockUse, CompletedCall, WorkerLoad
from clairvoyant.policy.cache_continuum import ContinuumCache, best_ttl, prior_ttl
from clairvoyant.policy.cache_kvflow import KvFlowCache
from clairvoyant.policy.cache_paths import agents_in_path, template_sources
from clairvoyant.policy.cache_pythia import PythiaCache
from clairvoyant.policy.cache_saga import LatencyEma, SagaCache, memory_pressure
from clairvoyant.profiler.core.expr import (
    Agent,
    Alt,
    End,
    Expr,
    FanOut,
    Opt,
    Repeat,
    Seq,
    agents_of,
    parse,
    to_text,
)
from tests.policy.cache_view_fake import FakeView

pytestmark = pytest.mark.unit

TENANT, WF, MODEL = "acme", "wf-1", "m"
FROM_A = "${a[-1]:prompt:[0,$]}${a[-1]:response:[0,$]}${new}"
STATIC = "${static:[0,$]}${new}"


def meta(
    agent: str, *, workflow_id: str = WF, tool: str | None = None, end: bool | None = None
) -> AppMetadata:
    return AppMetadata("coding", workflow_id, agent, tool=tool, workflow_end=end)


def note(
    path: str,
    *,
    next_agent: str = "",
    template: str = "",
    remaining: float | None = None,
    projection: tuple[ProjectedCalls, ...] = (),
    confidence: Confidence = Confidence.HIGH,
) -> SysAnnotations:
    nexts = (NextAgent(next_agent, 1.0),) if next_agent else ()
    return SysAnnotations(
        confidence=confidence,
        predicted_path_regex=path,
        next_agents=nexts,
        prompt_composition=template,
        expected_remaining_time_s=remaining,
        projection=projection,
    )


def done(
    agent: str,
    *,
    ann: SysAnnotations | None = None,
    worker: str = "w1",
    start: float = 0.0,
    end: float = 1.0,
    tool: str | None = None,
    last: bool | None = None,
    prompt: tuple[int, ...] = (),
    response: tuple[int, ...] = (),
    tokens: int = 0,
    prompt_ids: tuple[int, ...] = (),
    workflow_id: str = WF,
) -> CompletedCall:
    return CompletedCall(
        f"r-{agent}-{start}",
        TENANT,
        MODEL,
        worker,
        start,
        end,
        prompt_tokens=tokens,
        app_metadata=meta(agent, workflow_id=workflow_id, tool=tool, end=last),
        annotations=ann,
        prompt_block_hashes=prompt,
        response_block_hashes=response,
        prompt_token_ids=prompt_ids,
    )


def block(h: int, agent: str, *, last: float = 0.0, tokens: int = 0, workflow_id: str = WF) -> BlockUse:
    return BlockUse(h, last, tenant=TENANT, workflow_id=workflow_id, agent_id=agent, tokens=tokens)


def load(worker: str, *, used: int = 0, running: int = 0, l3: bool = True) -> WorkerLoad:
    return WorkerLoad(worker, MODEL, running=running, l1_used=used, l1_total=100, l2_total=400, has_l3=l3)


def kinds(directives: list[CacheDirective]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(d.kind, d.worker_id, d.block_hashes) for d in directives]


# ---- path expressions and templates ------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "a->b->c",
        "(a->b){2,3}->c",
        "<w>{3}->agg",
        "coder->(review->fix)?->$",
        "(x|y-z)->q.1->$",
        "plan->(code->(test|lint)){1,4}",
        "<r1|r2>{2,5}->judge",
        "a-b->c=d/e",
    ],
)
def test_the_path_scanner_finds_the_agents_the_profiler_parser_finds(text: str) -> None:
    assert agents_in_path(text) == agents_of(parse(text))


NAMES = ("a", "b-2", "x.y", "r:1", "q=+", "fix", "a-")


def random_path(rng: random.Random, depth: int) -> Expr:
    """A random tree of the profiler's path grammar (agent names with '-', ':', '=', '+', '.')."""
    choice = rng.randrange(6) if depth > 0 else 0
    if choice == 0:
        return Agent(rng.choice(NAMES))
    if choice == 1:
        return Seq(tuple(random_path(rng, depth - 1) for _ in range(rng.randint(2, 3))))
    if choice == 2:
        return Alt(tuple(random_path(rng, depth - 1) for _ in range(rng.randint(2, 3))))
    if choice == 3:
        return Opt(random_path(rng, depth - 1))
    if choice == 4:
        low = rng.randint(0, 3)
        return Repeat(random_path(rng, depth - 1), low, low + rng.randint(0 if low else 1, 2))
    members = tuple(Agent(n) for n in rng.sample(NAMES, rng.randint(1, 3)))
    body = members[0] if len(members) == 1 else Alt(members)
    return FanOut(body, 1, rng.randint(1, 4))


@pytest.mark.parametrize("seed", range(20))
def test_the_path_scanner_agrees_with_the_parser_on_random_expressions(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        text = to_text(Seq((random_path(rng, 3), End())))
        assert agents_in_path(text) == agents_of(parse(text)), text


def test_template_sources_are_the_agents_a_template_copies_from() -> None:
    assert template_sources(FROM_A) == {"a"}
    assert template_sources("${static:[0,$]}${coder[-2]:response:[0,64]}${new}") == {"coder"}
    assert template_sources(STATIC) == frozenset()


# ---- pythia (Alg. 1) ---------------------------------------------------------------------------
def knowing(**templates: str) -> PythiaCache:
    """A pythia policy that has already seen these agents' prompt templates (workflow type "coding")."""
    policy = PythiaCache()
    for agent, template in templates.items():
        policy.templates[(TENANT, "coding", agent)] = template
    return policy


def chain_view() -> FakeView:
    view = FakeView(loads=[load("w1"), load("w2", l3=False)])
    view.hold("w1", 1, block(1, "sys"), block(2, "a"), block(3, "a"))
    view.hold("w2", 2, block(4, "a"))
    view.refs[(TENANT, 1)] = 2  # the system prompt other workflows share
    return view


def test_pythia_chain_drops_a_finished_agent_nobody_copies_from() -> None:
    view = chain_view()
    out = knowing(c=STATIC).on_completion(
        done("a", ann=note("b->c", next_agent="b", template=STATIC)), view, 1.0
    )
    assert kinds([d for d in out if d.kind == "drop"]) == [("drop", "w1", (2, 3)), ("drop", "w2", (4,))]
    assert all(d.target_tier is None for d in out if d.kind == "drop")  # every tier
    assert kinds([d for d in out if d.kind != "drop"]) == [("write_back", "w1", (1,))]  # device memory stays LRU


def test_pythia_chain_retains_what_the_next_template_copies_and_writes_it_to_l3() -> None:
    view = chain_view()
    out = PythiaCache().on_completion(
        done("a", ann=note("b->c", next_agent="b", template=FROM_A, remaining=90)), view, 1
    )
    assert [d for d in out if d.kind == "drop"] == []
    retains = [(d.worker_id, d.block_hashes, d.target_tier, d.ttl_s) for d in out if d.kind == "retain"]
    assert retains == [("w2", (4,), 2, 90.0)]  # pinned in host memory only; device memory stays LRU
    assert kinds([d for d in out if d.kind == "write_back"]) == [
        ("write_back", "w1", (1, 2, 3))
    ]  # w2 has no L3


def test_pythia_retain_ttl_is_the_remaining_time_clamped() -> None:
    view = chain_view()
    ttls = [
        {
            d.ttl_s
            for d in PythiaCache().on_completion(done("a", ann=note("a->b", remaining=r)), view, 1)
            if d.kind == "retain"
        }
        for r in (5.0, None, 5000.0)
    ]
    assert ttls == [{30.0}, {120.0}, {600.0}]


def test_pythia_loop_keeps_both_agents_of_a_loop_still_to_run() -> None:
    view = FakeView(loads=[load("w1")])
    view.hold("w1", 1, block(1, "a"), block(2, "b"), block(3, "plan"))
    out = knowing(a=STATIC, b=STATIC).on_completion(done("b", ann=note("(a->b){1,2}->$")), view, 1)
    assert kinds([d for d in out if d.kind in ("drop", "write_back")]) == [
        ("drop", "w1", (3,)),
        ("write_back", "w1", (1, 2)),
    ]


def test_pythia_fan_out_keeps_the_planner_only_when_the_workers_template_copies_it() -> None:
    view = FakeView(loads=[load("w1")])
    view.hold("w1", 1, block(1, "plan"), block(2, "plan"))
    policy = knowing(agg=STATIC)
    first = policy.on_completion(
        done("plan", ann=note("<w>{3}->agg", next_agent="w", template=STATIC)), view, 1
    )
    assert kinds([d for d in first if d.kind == "drop"]) == [("drop", "w1", (1, 2))]
    fan = "${plan[-1]:prompt:[0,$]}${plan[-1]:response:[0,$]}${new}"
    second = policy.on_completion(
        done("plan", ann=note("<w>{3}->agg", next_agent="w", template=fan)), view, 2
    )
    assert [d for d in second if d.kind == "drop"] == []


def test_pythia_rework_keeps_the_coder_the_reviewer_reads_and_drops_the_tester() -> None:
    view = FakeView(loads=[load("w1")])
    view.hold("w1", 1, block(1, "coder"), block(2, "test"))
    review = "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}"
    out = knowing(fix=STATIC).on_completion(
        done("test", ann=note("(review->fix)?->$", next_agent="review", template=review)), view, 1
    )
    assert kinds([d for d in out if d.kind in ("drop", "write_back")]) == [
        ("drop", "w1", (2,)),
        ("write_back", "w1", (1,)),
    ]


def test_pythia_learns_templates_so_a_later_call_keeps_a_future_agents_source() -> None:
    view = FakeView(loads=[load("w1")])
    view.hold("w1", 1, block(1, "a"), block(2, "x"))
    policy = PythiaCache()
    policy.on_completion(
        done("x", ann=note("a->c", next_agent="c", template=FROM_A), workflow_id="other"), view, 1
    )
    out = policy.on_completion(done("x", ann=note("c->$")), view, 2)  # c's template (learned) copies a
    assert kinds([d for d in out if d.kind in ("drop", "write_back")]) == [
        ("drop", "w1", (2,)),
        ("write_back", "w1", (1,)),
    ]


def staged_view(*, busy: bool, in_l3: bool) -> tuple[FakeView, tuple[int, ...]]:
    tokens = tuple(range(64))
    view = FakeView(
        loads=[load("w1", used=90), load("w2", used=10, running=2 if busy else 0), load("w3", used=50)]
    )
    if in_l3:
        view.hold("w1", 3, *(block(h, "a") for h in chain_hashes(tokens)[:2]))
    view.prompts[(TENANT, WF, FROM_A)] = tokens
    return view, tokens


@pytest.mark.parametrize("busy", [False, True])
def test_pythia_promotes_the_next_prompt_to_l2_on_the_roomiest_worker(busy: bool) -> None:
    view, tokens = staged_view(busy=busy, in_l3=True)
    out = PythiaCache().on_completion(done("a", ann=note("b", next_agent="b", template=FROM_A)), view, 1)
    staged = [d for d in out if d.speculative]
    assert [(d.kind, d.worker_id, d.target_tier, d.token_ids) for d in staged] == [
        ("promote", "w2", 2, tokens)
    ]


def test_pythia_pre_prefills_only_on_an_idle_worker_and_never_promotes_to_l1() -> None:
    view, tokens = staged_view(busy=False, in_l3=False)
    idle = PythiaCache().on_completion(done("a", ann=note("b", next_agent="b", template=FROM_A)), view, 1)
    assert [(d.kind, d.worker_id, d.token_ids) for d in idle if d.speculative] == [
        ("pre_prefill", "w2", tokens)
    ]
    view, _ = staged_view(busy=True, in_l3=False)
    busy = PythiaCache().on_completion(done("a", ann=note("b", next_agent="b", template=FROM_A)), view, 1)
    assert [d for d in busy if d.speculative] == []
    assert all(d.target_tier != 1 for d in idle + busy if d.kind == "promote")


def test_pythia_prefers_the_worker_already_holding_the_prompt_in_l2_on_equal_room() -> None:
    tokens = tuple(range(64))
    view = FakeView(loads=[load("w1", used=10), load("w2", used=10)])
    view.hold("w2", 2, block(chain_hashes(tokens)[0], "a"))
    view.prompts[(TENANT, WF, FROM_A)] = tokens
    out = PythiaCache().on_completion(done("a", ann=note("b", next_agent="b", template=FROM_A)), view, 1)
    assert [(d.kind, d.worker_id) for d in out if d.speculative] == [("promote", "w2")]


def test_pythia_does_nothing_without_a_trusted_prediction() -> None:
    view = chain_view()
    policy = PythiaCache()
    assert policy.on_completion(done("a"), view, 1) == []
    assert policy.on_completion(done("a", ann=note("b->c", confidence=Confidence.SHADOW)), view, 1) == []
    assert policy.on_completion(done("a", ann=note("")), view, 1) == []


def test_pythia_workflow_end_drops_its_unshared_blocks() -> None:
    view = chain_view()
    out = PythiaCache().on_completion(done("c", last=True), view, 1)
    assert kinds(out) == [("drop", "w1", (2, 3)), ("drop", "w2", (4,))]


def test_pythia_keeps_every_block_while_a_future_agents_template_is_unknown() -> None:
    view = chain_view()
    out = PythiaCache().on_completion(done("a", ann=note("b->c", next_agent="b", template=STATIC)), view, 1.0)
    assert [d for d in out if d.kind == "drop"] == []  # c may copy from a: nothing is provably dead
    assert kinds([d for d in out if d.kind in ("retain", "write_back")]) == [
        ("retain", "w2", (4,)),
        ("write_back", "w1", (1, 2, 3)),
    ]


def test_pythia_ranks_dead_blocks_first_then_lru_then_the_future_path() -> None:
    policy = knowing(b=STATIC, c=STATIC)
    policy.on_completion(done("a", ann=note("b->c")), chain_view(), 1)
    blocks = {
        "live": block(7, "b", last=1.0),
        "dead": block(8, "a", last=9.0),
        "untracked": block(9, "a", last=5.0, workflow_id="other"),
    }
    order = sorted(blocks, key=lambda name: policy.eviction_rank(blocks[name], 10.0))
    assert order == ["dead", "untracked", "live"]


# ---- saga --------------------------------------------------------------------------------------
def test_saga_tool_latency_p95_is_an_ema_of_mean_and_variance() -> None:
    stats = LatencyEma(10.0, 0.0, 1).add(20.0, 0.1)
    assert (stats.mean, stats.variance) == pytest.approx((11.0, 9.0))
    assert stats.p95() == pytest.approx(11.0 + 1.6449 * 3.0)


def test_saga_pressure_is_linear_between_the_soft_and_hard_thresholds() -> None:
    assert [memory_pressure(u) for u in (0.5, 0.7, 0.8, 0.9, 0.99)] == pytest.approx(
        [0.0, 0.0, 0.5, 1.0, 1.0]
    )


def saga_after_tool_calls(latencies: list[float]) -> SagaCache:
    """coder -> (pytest) -> coder ... with the given tool latencies."""
    policy, view, clock = SagaCache(), FakeView(loads=[load("w1")]), 0.0
    for index, latency in enumerate([None, *latencies]):
        start = clock + (latency or 0.0)
        policy.on_completion(
            done("coder", start=start, end=start + 1, tool="pytest" if index else None), view, start + 1
        )
        clock = start + 1
    return policy


def test_saga_ttl_is_the_p95_capped_and_scaled_down_under_pressure() -> None:
    policy = saga_after_tool_calls([10.0, 20.0])
    p95 = 11.0 + 1.6449 * 3.0
    assert [policy.tool_ttl(TENANT, "pytest", u) for u in (0.5, 0.8, 0.95)] == pytest.approx(
        [p95, p95 / 2, 0.0]
    )
    assert saga_after_tool_calls([1000.0]).tool_ttl(TENANT, "pytest", 0.0) == 300.0
    assert policy.tool_ttl(TENANT, "grep", 0.0) == 0.0  # never seen


def test_saga_retains_a_call_starting_a_tool_and_prefetches_the_successor() -> None:
    policy = saga_after_tool_calls([10.0, 20.0])
    tokens = tuple(range(32))
    view = FakeView(loads=[load("w1", used=80)])
    view.hold("w9", 3, block(chain_hashes(tokens)[0], "coder"))
    view.prompts[(TENANT, WF, FROM_A)] = tokens
    call = done(
        "coder",
        start=100,
        end=101,
        prompt=(5, 6),
        response=(7,),
        ann=note("coder", next_agent="coder", template=FROM_A),
    )
    out = policy.on_completion(call, view, 101)
    retain, promote = out
    assert (retain.kind, retain.block_hashes, retain.target_tier) == ("retain", (5, 6, 7), 1)
    assert retain.ttl_s == pytest.approx((11.0 + 1.6449 * 3.0) * 0.5)
    assert (promote.kind, promote.worker_id, promote.target_tier, promote.token_ids, promote.speculative) == (
        "promote",
        "w1",
        2,
        tokens,
        True,
    )


def test_saga_wa_lru_orders_by_weighted_recency_reuse_and_size() -> None:
    policy = SagaCache()
    policy.on_completion(done("a", tokens=1000, ann=note("b", next_agent="b")), FakeView(), 0)
    reused = block(1, "b", last=0.0, tokens=500)  # R 0.5, U 1, S 0.5
    recent = block(2, "a", last=150.0, tokens=1000)  # R 1, U 0, S 1
    stale = block(3, "a", last=0.0, tokens=0)  # R 0.5, U 0, S 0
    scores = [policy.score(b, 150.0) for b in (reused, recent, stale)]
    assert scores == pytest.approx([0.3 * 0.5 + 0.5 + 0.2 * 0.5, 0.3 + 0.2, 0.3 * 0.5])
    assert sorted((reused, recent, stale), key=lambda b: policy.eviction_rank(b, 150.0)) == [
        stale,
        recent,
        reused,
    ]


def test_saga_drops_unreused_blocks_on_a_worker_past_the_hard_threshold() -> None:
    policy = SagaCache()
    view = FakeView(loads=[load("w1", used=95), load("w2", used=50)])
    view.hold("w1", 1, block(1, "a"), block(2, "b"))
    view.hold("w2", 1, block(3, "a"))
    policy.on_completion(done("a", ann=note("b", next_agent="b")), view, 1)
    assert kinds(policy.on_tick(view, 2)) == [("drop", "w1", (1,))]


# ---- kvflow ------------------------------------------------------------------------------------
def kvflow_projection() -> tuple[ProjectedCalls, ...]:
    return (
        ProjectedCalls(1, "b", 1.0),
        ProjectedCalls(2, "c", 0.5),
        ProjectedCalls(3, "d", 1.0),
        ProjectedCalls(3, "b", 1.0),
        ProjectedCalls(2, "e", 0.0),
    )


def test_kvflow_hold_priority_is_steps_to_execution_capped() -> None:
    policy = KvFlowCache()
    policy.on_completion(done("a", ann=note("b", projection=kvflow_projection())), FakeView(), 1)
    levels = {agent: policy.hold_priority(TENANT, WF, agent) for agent in ("b", "c", "d", "e", "a", "")}
    assert levels == {"b": 1, "c": 2, "d": 3, "e": 5, "a": 5, "": 6}
    far = [ProjectedCalls(9, "z", 1.0)]
    policy.on_completion(done("a", ann=note("z", projection=tuple(far)), workflow_id="wf-2"), FakeView(), 1)
    assert policy.hold_priority(TENANT, "wf-2", "z") == 5  # min(evict_pri_level + 1, 9)


def test_kvflow_evicts_far_agents_first_and_shared_prefixes_keep_the_nearest() -> None:
    policy = KvFlowCache()
    policy.on_completion(done("d", prompt=(50,)), FakeView(), 0)  # block 50 also used by d
    policy.on_completion(done("a", ann=note("b", projection=kvflow_projection())), FakeView(), 1)
    blocks = [
        block(10, "b", last=1.0),
        block(11, "d", last=9.0),
        block(12, "a", last=5.0),
        block(13, "c", last=0.0),
    ]
    shared = block(50, "a", last=0.0)  # a (5) and d (3): level 3
    order = sorted([*blocks, shared], key=lambda b: policy.eviction_rank(b, 10.0))
    assert [b.block_hash for b in order] == [12, 50, 11, 13, 10]


def test_kvflow_prefetches_agents_due_within_load_ahead_step() -> None:
    policy = KvFlowCache()
    prompts = {agent: tuple(range(i * 100, i * 100 + 32)) for i, agent in enumerate("bcd", start=1)}
    view = FakeView(loads=[load("w1"), load("w2")])
    for agent, tokens in prompts.items():
        policy.on_completion(done(agent, prompt_ids=tokens), view, 0)
        view.hold("w2", 2, *(block(h, agent) for h in chain_hashes(tokens)))
    out = policy.on_completion(done("a", ann=note("b", projection=kvflow_projection())), view, 1)
    assert [(d.kind, d.worker_id, d.agent_id, d.target_tier, d.token_ids) for d in out] == [
        ("promote", "w2", "b", 1, prompts["b"]),
        ("promote", "w2", "c", 1, prompts["c"]),
    ]


# ---- continuum ---------------------------------------------------------------------------------
def test_continuum_ttl_maximises_expected_utility() -> None:
    assert best_ttl([1.0, 2.0, 3.0, 4.0, 100.0], benefit_s=2.0, cost_per_s=0.1) == 4.0
    assert best_ttl([5.0, 5.0], benefit_s=0.1, cost_per_s=1.0) == 0.0
    assert prior_ttl(2.0, benefit_s=2.0, cost_per_s=0.1) == pytest.approx(2.0 * math.log(10.0))
    assert prior_ttl(2.0, benefit_s=0.1, cost_per_s=0.1) == 0.0


def continuum_after_tool_calls(latencies: list[float]) -> ContinuumCache:
    policy, view, clock = ContinuumCache(), FakeView(loads=[load("w1")]), 0.0
    for index, latency in enumerate([None, *latencies]):
        start = clock + (latency or 0.0)
        policy.on_completion(
            done("coder", start=start, end=start + 1, tool="bash" if index else None), view, start + 1
        )
        clock = start + 1
    return policy


def test_continuum_pins_only_agents_a_later_call_continues() -> None:
    policy = continuum_after_tool_calls([1.0, 2.0, 3.0, 4.0, 100.0])
    view = FakeView(loads=[load("w1")])
    hashes = tuple(range(1, 11))  # 10 of the worker's 100 blocks: m = 0.1
    continued = done("coder", start=200, end=201, prompt=hashes, tokens=20_000, ann=note("coder->$"))
    out = policy.on_completion(continued, view, 201)
    assert [(d.kind, d.block_hashes, d.ttl_s, d.target_tier) for d in out] == [("retain", hashes, 4.0, 1)]
    assert policy.eviction_rank(block(3, "coder", last=1.0), 202) > policy.eviction_rank(
        block(99, "x", last=150), 202
    )
    assert policy.eviction_rank(block(3, "coder", last=1.0), 206) == 1.0  # the pin expired
    ended = done(
        "coder", start=300, end=301, prompt=hashes, tokens=20_000, ann=note("review->$", template=STATIC)
    )
    assert continuum_after_tool_calls([1.0, 2.0, 3.0, 4.0, 100.0]).on_completion(ended, view, 301) == []
    assert (
        continuum_after_tool_calls([1.0]).on_completion(done("coder", prompt=hashes, tokens=20_000), view, 9)
        == []
    )


def test_continuum_cold_start_uses_the_exponential_prior() -> None:
    policy = continuum_after_tool_calls([2.0])  # one sample: mean 2 s
    call = done("coder", start=50, end=51, prompt=tuple(range(1, 11)), tokens=20_000, ann=note("coder"))
    (pin,) = policy.on_completion(call, FakeView(loads=[load("w1")]), 51)
    assert pin.ttl_s == pytest.approx(2.0 * math.log(10.0))


# ---- the engines' baselines --------------------------------------------------------------------
def test_lru_and_lmcache_rank_by_last_access_and_lmcache_writes_through() -> None:
    lru, lmcache = CACHE_POLICIES.create("lru"), CACHE_POLICIES.create("lmcache")
    view = FakeView(loads=[load("w1"), load("w2", l3=False)])
    call = done("a", prompt=(1, 2), response=(3,))
    assert lru.on_completion(call, view, 1) == []
    assert kinds(lmcache.on_completion(call, view, 1)) == [("write_back", "w1", (1, 2, 3))]
    assert lmcache.on_completion(done("a", worker="w2", prompt=(1, 2)), view, 1) == []
    old, new = block(1, "a", last=1.0), block(2, "a", last=2.0)
    assert [p.eviction_rank(old, 3) < p.eviction_rank(new, 3) for p in (lru, lmcache)] == [True, True]


def test_hicache_writes_a_block_to_l3_at_its_second_hit_once() -> None:
    policy, view = CACHE_POLICIES.create("hicache"), FakeView(loads=[load("w1")])
    writes = [
        kinds(policy.on_completion(done("a", prompt=p, response=r), view, i))
        for i, (p, r) in enumerate([((1, 2), (3,)), ((1, 2), ()), ((1, 2, 3), ()), ((1, 2, 3), ())])
    ]
    assert writes == [[], [], [("write_back", "w1", (1, 2))], [("write_back", "w1", (3,))]]


# ---- every policy ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CACHE_POLICIES.names()))
def test_every_policy_takes_calls_without_metadata_or_annotations(name: str) -> None:
    """Only the write-through baseline acts on a call it knows nothing of but its blocks."""
    policy = CACHE_POLICIES.create(name)
    view = chain_view()
    bare = CompletedCall(
        "r1", TENANT, MODEL, "w1", 0.0, 1.0, prompt_block_hashes=(1, 2), response_block_hashes=(3,)
    )
    expected = [("write_back", "w1", (1, 2, 3))] if name == "lmcache" else []
    assert kinds(policy.on_completion(bare, view, 1.0)) == expected
    assert policy.on_completion(done("a"), view, 2.0) == []
    assert policy.on_tick(view, 3.0) == []
    assert math.isfinite(policy.eviction_rank(block(1, "a"), 3.0))


STATEFUL = {"continuum", "kvflow", "pythia", "saga"}  # rank a known workflow's blocks differently


@pytest.mark.parametrize("name", sorted(CACHE_POLICIES.names()))
def test_forget_leaves_a_workflow_on_the_footing_of_one_never_seen(name: str) -> None:
    policy = CACHE_POLICIES.create(name)
    view = chain_view()
    ann = note("a", next_agent="a", projection=(ProjectedCalls(1, "a", 1.0),))
    policy.on_completion(done("a", tool="bash", ann=ann), view, 1)
    policy.on_completion(done("a", start=5, end=6, tool="bash", prompt=(2,), tokens=50_000, ann=ann), view, 6)
    seen, unseen = (
        block(2, "a", last=3.0, tokens=10),
        block(99, "a", last=3.0, tokens=10, workflow_id="never"),
    )
    assert (policy.eviction_rank(seen, 7.0) != policy.eviction_rank(unseen, 7.0)) == (name in STATEFUL)
    policy.forget(TENANT, WF)
    assert policy.eviction_rank(seen, 7.0) == policy.eviction_rank(unseen, 7.0)
    assert policy.on_tick(view, 8.0) == []


# ---- pythia driven through the cache manager's core ---------------------------------------------
SYSTEM = tuple(range(1000, 1016))  # one block every workflow's prompt starts with


def core_with_chain(template: str) -> tuple[CacheManagerCore, list[CacheDirective], tuple[int, ...]]:
    """Workflow WF ran agent ``a`` on w1; wf-2 (live) shares the system block; ``a`` finished with
    the prediction ``b -> c`` and ``template`` for ``b``."""
    core = CacheManagerCore(knowing(c=STATIC), policy_name="pythia")
    core.on_worker_load(load("w1", used=90), 0.0)
    core.on_worker_load(load("w2", used=10), 0.0)
    prompt, output = (*SYSTEM, *range(16)), tuple(range(16, 32))
    prompt_chain, response_chain = sequence_hashes(prompt, output)
    stored = KvBlockEvent(KvEventKind.STORED, KvTier.L1, TENANT, (*prompt_chain, *response_chain), WF, "a")
    core.on_kv_batch(KvBatch("w1", MODEL, 16, 1, (stored,)), 0.5)
    other = CompletedCall(
        "r-0",
        TENANT,
        MODEL,
        "w2",
        0.0,
        0.6,
        prompt_token_ids=(*SYSTEM, *[7] * 16),
        app_metadata=meta("a", workflow_id="wf-2"),
    )
    assert core.on_completion(other, 0.6) == []  # no annotation: LRU stands
    call = CompletedCall(
        "r-a",
        TENANT,
        MODEL,
        "w1",
        0.0,
        1.0,
        prompt_token_ids=prompt,
        output_token_ids=output,
        app_metadata=meta("a"),
        annotations=note("b->c", next_agent="b", template=template),
    )
    return core, core.on_completion(call, 1.0), (*prompt, *output)


def test_pythia_in_the_core_drops_the_dead_lineage_and_keeps_the_shared_system_prompt() -> None:
    core, out, tokens = core_with_chain(STATIC)
    system, *rest = chain_hashes(tokens)
    assert kinds(out) == [
        ("drop", "w1", tuple(sorted(rest))),
        ("write_back", "w1", (system,)),
    ]
    assert core.plan("w1") == out and core.stats().directives_by_kind == (
        ("drop", 1),
        ("write_back", 1),
    )


def test_pythia_in_the_core_stages_the_assembled_next_prompt_in_l2_on_the_roomiest_worker() -> None:
    core, out, tokens = core_with_chain(FROM_A)
    assert [(d.kind, d.worker_id) for d in out if not d.speculative] == [("write_back", "w1")]
    (staged,) = [d for d in out if d.speculative]
    assert (staged.kind, staged.worker_id, staged.target_tier, staged.token_ids) == (
        "promote",
        "w2",
        2,
        tokens,
    )


def test_pythia_in_the_core_drops_the_unshared_blocks_when_the_workflow_ends() -> None:
    core, _, tokens = core_with_chain(FROM_A)
    last = CompletedCall("r-c", TENANT, MODEL, "w1", 2.0, 3.0, app_metadata=meta("c", end=True))
    system, *rest = chain_hashes(tokens)
    assert kinds(core.on_completion(last, 3.0)) == [("drop", "w1", tuple(sorted(rest)))]
    assert core.policy.eviction_rank(block(rest[0], "a", last=2.0), 4.0) == 2.0  # forgotten: plain LRU
