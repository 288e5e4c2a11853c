"""The pythia preset (seeds/000 §4.2.2): capacity check and ε, headroom and its tie-break, each
priority term, the aging rule, and what unannotated requests get.  Driven directly, no mocks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.pythia import (
    LengthBound,
    NodeLoad,
    PythiaAgingRule,
    PythiaCapacityRouting,
    PythiaPriority,
    PythiaPriorityConfig,
    PythiaRoutingConfig,
    capable,
    completion_score,
    length_bound,
)
from clairvoyant.scheduler.core import GlobalScheduler, QueuedRequest, WorkerReport

pytestmark = pytest.mark.unit

CODE, REASON = "code", "reason"
HIGH, SHADOW = common_pb2.CONFIDENCE_HIGH, common_pb2.CONFIDENCE_SHADOW


def sys_ann(
    *,
    p99: float | None = None,
    remaining: float | None = None,
    next_agents: tuple[tuple[str, float], ...] = (),
    confidence: common_pb2.Confidence = HIGH,
) -> common_pb2.SysAnnotations:
    out = common_pb2.SysAnnotations(
        confidence=confidence,
        next_agents=[common_pb2.NextAgent(agent_id=a, probability=p) for a, p in next_agents],
    )
    if p99 is not None:
        out.predicted_output_len.CopyFrom(common_pb2.LengthInterval(p50=p99 / 2, p99=p99))
    if remaining is not None:
        out.expected_remaining_steps = remaining
    return out


def req(
    request_id: str,
    arrival: float = 0.0,
    *,
    model: str = CODE,
    prompt: int = 0,
    max_tokens: int = 0,
    workflow: str | None = None,
    agent: str = "engineer",
    ann: common_pb2.SysAnnotations | None = None,
) -> QueuedRequest:
    meta = AppMetadata("app", workflow, agent) if workflow is not None else None
    annotations = annotations_from_proto(ann) if ann is not None else None
    return QueuedRequest(request_id, "t", model, arrival, prompt, max_tokens, meta, annotations)


def worker(
    worker_id: str, *, model: str = CODE, blocks: int = 100, max_batch: int = 64, queued: int = 0
) -> WorkerReport:
    return WorkerReport(worker_id, model, f"{worker_id}:1", max_batch, queued=queued, kv_blocks_total=blocks,
                        max_model_len=4096)  # fmt: skip


def pythia(*workers: WorkerReport, epsilon: float = 0.5) -> GlobalScheduler:
    sched = GlobalScheduler(
        PythiaPriority(), PythiaCapacityRouting(PythiaRoutingConfig(epsilon=epsilon)), policy_name="pythia"
    )
    for w in workers:
        sched.update_worker(w, 0.0)
    return sched


def placed(sched: GlobalScheduler, now: float = 0.0) -> list[tuple[str, str]]:
    decisions = sched.dispatch(now)
    sched.check_integrity()
    return [(d.request_id, d.worker_id) for d in decisions]


# ---- the bound u_i and the capacity check ---------------------------------------------------------


def test_the_bound_is_prompt_plus_p99_when_trusted_and_a_hard_bound_otherwise() -> None:
    assert length_bound(req("a", prompt=100, max_tokens=50, ann=sys_ann(p99=99.2)), 4096, 0.01) == (
        200,
        0.01,
    )
    # SHADOW and unannotated: prompt + max_tokens with alpha 0; without max_tokens, the context window.
    shadow = req("b", prompt=100, max_tokens=50, ann=sys_ann(p99=99.2, confidence=SHADOW))
    assert length_bound(shadow, 4096, 0.01) == (150, 0.0)
    assert length_bound(req("c", prompt=100), 4096, 0.01) == (4096, 0.0)
    # Trusted but without a length interval (a profile with no length data yet): the hard bound too.
    assert length_bound(req("d", prompt=10, max_tokens=5, ann=sys_ann(remaining=1)), 4096, 0.01) == (
        15,
        0.0,
    )


def test_capacity_holds_at_an_exact_fit_and_fails_one_token_over() -> None:
    load = NodeLoad(capacity_tokens=1000, reserved_tokens=700, failure_bound=0.0, active=1)
    assert capable(load, LengthBound(300, 0.0), 0.5)
    assert not capable(load, LengthBound(301, 0.0), 0.5)


def test_the_union_bound_admits_exactly_epsilon_over_alpha_requests() -> None:
    # 49 active p99 requests (sum of alphas 0.49) + the new one = 0.50 <= 0.5; 50 active: 0.51.
    assert capable(NodeLoad(1e9, 0, 49 * 0.01, 49), LengthBound(1, 0.01), 0.5)
    assert not capable(NodeLoad(1e9, 0, 50 * 0.01, 50), LengthBound(1, 0.01), 0.5)
    # A hard bound adds no failure probability.
    assert capable(NodeLoad(1e9, 0, 50 * 0.01, 50), LengthBound(1, 0.0), 0.5)


def test_an_empty_node_takes_even_a_request_larger_than_its_capacity() -> None:
    assert capable(NodeLoad(100, 0, 0.0, 0), LengthBound(5000, 0.01), 0.0)


def test_epsilon_limits_annotated_requests_per_node_and_the_rest_wait() -> None:
    # epsilon 0.02 with alpha 0.01: two annotated requests per node.
    sched = pythia(worker("w0", blocks=10_000), epsilon=0.02)
    for i in range(3):
        sched.submit(req(f"r{i}", float(i), ann=sys_ann(p99=10)), now=float(i))
    assert placed(sched, 3.0) == [("r0", "w0"), ("r1", "w0")]
    assert sched.is_queued("r2")
    assert sched.complete("r0", now=4.0)
    assert placed(sched, 4.0) == [("r2", "w0")]


def test_a_request_waits_until_the_reserved_bounds_leave_room() -> None:
    # 10 blocks x 16 = 160 tokens.  r0 reserves 100 (prompt 50 + p99 50); r1 needs 61 > 60 left.
    sched = pythia(worker("w0", blocks=10))
    sched.submit(req("r0", 0.0, prompt=50, ann=sys_ann(p99=50)), now=0.0)
    sched.submit(req("r1", 1.0, prompt=11, ann=sys_ann(p99=50)), now=1.0)
    assert placed(sched, 1.0) == [("r0", "w0")]
    assert sched.complete("r0", now=2.0)
    assert placed(sched, 2.0) == [("r1", "w0")]


# ---- headroom and the tie-break -------------------------------------------------------------------


def test_the_request_goes_to_the_largest_headroom() -> None:
    # w0: 100 blocks = 1600 tokens, w1: 50 blocks = 800 tokens.
    sched = pythia(worker("w0", blocks=100), worker("w1", blocks=50))
    sched.submit(req("big", 0.0, prompt=500, ann=sys_ann(p99=500)), now=0.0)
    assert placed(sched) == [("big", "w0")]  # 1600 - 1000 = 600 > 800 - 1000
    sched.submit(req("small", 1.0, prompt=50, ann=sys_ann(p99=50)), now=1.0)
    assert placed(sched, 1.0) == [("small", "w1")]  # 800 - 100 = 700 > 1600 - 1000 - 100 = 500


def test_ties_go_to_the_programs_last_engine_then_the_smallest_id() -> None:
    sched = pythia(worker("w0"), worker("w1"))
    sched.submit(req("a1", 0.0, prompt=10, max_tokens=10, workflow="A"), now=0.0)
    sched.submit(req("b1", 1.0, prompt=10, max_tokens=10, workflow="B"), now=1.0)
    assert placed(sched, 1.0) == [("a1", "w0"), ("b1", "w1")]  # a1: a tie -> w0; b1: more headroom on w1
    assert sched.complete("a1", now=2.0) and sched.complete("b1", now=2.0)
    # Both nodes empty again: B's next call goes back to w1, a call of no program to w0.
    sched.submit(req("b2", 3.0, prompt=10, max_tokens=10, workflow="B"), now=3.0)
    assert placed(sched, 3.0) == [("b2", "w1")]
    assert sched.complete("b2", now=4.0)
    sched.submit(req("x", 5.0, prompt=10, max_tokens=10), now=5.0)
    assert placed(sched, 5.0) == [("x", "w0")]


def test_ties_go_first_to_the_worker_the_kv_index_says_holds_the_sessions_blocks() -> None:
    """§4.2.2: among equally safe nodes, the one already holding the request's context in host
    memory (what the cache manager staged there shows in the workers' KV events)."""
    sched = pythia(worker("w0"), worker("w1"))
    sched.submit(req("a1", 0.0, prompt=10, max_tokens=10, workflow="A"), now=0.0)
    assert placed(sched, 0.0) == [("a1", "w0")]  # no index data: the smallest id
    assert sched.complete("a1", now=1.0)
    staged = KvBlockEvent(KvEventKind.STORED, KvTier.L2, "t", (11, 12, 13), workflow_id="A")
    sched.apply_kv_events(KvBatch("w1", CODE, 16, 1, (KvBlockEvent(KvEventKind.CLEARED, KvTier.L1), staged)), 1.5)
    sched.apply_kv_events(KvBatch("w0", CODE, 16, 1, (KvBlockEvent(KvEventKind.CLEARED, KvTier.L1),)), 1.5)
    sched.submit(req("a2", 2.0, prompt=10, max_tokens=10, workflow="A"), now=2.0)
    assert placed(sched, 2.0) == [("a2", "w1")]  # w1 holds A's blocks in L2: it beats A's last engine w0


# ---- the priority terms ---------------------------------------------------------------------------


def test_completion_score_is_one_over_the_remaining_distance_including_this_step() -> None:
    assert completion_score(annotations_from_proto(sys_ann(remaining=0))) == 1.0
    assert completion_score(annotations_from_proto(sys_ann(remaining=3))) == 0.25
    assert completion_score(annotations_from_proto(sys_ann())) == 0.0
    assert completion_score(None) == 0.0


def test_idle_risk_adds_the_probability_of_each_next_agent_whose_model_has_no_queue() -> None:
    sched = pythia(worker("c0", model=CODE), worker("r0", model=REASON))
    policy = sched.priority_policy
    assert isinstance(policy, PythiaPriority)
    # The scheduler learns each agent's model from the calls submitted.
    sched.submit(req("v", 0.0, model=REASON, workflow="W1", agent="verifier"), now=0.0)
    sched.submit(req("e", 0.0, model=CODE, workflow="W1", agent="engineer"), now=0.0)
    assert sorted(placed(sched)) == [("e", "c0"), ("v", "r0")]
    probe = req("p", 1.0, workflow="W2", agent="reviewer",
                ann=sys_ann(remaining=3, next_agents=(("verifier", 0.75), ("engineer", 0.25), ("ghost", 1.0))))  # fmt: skip
    # Both queues empty: 0.75 + 0.25 (ghost's model is unknown: nothing).
    assert policy.idle_risk(probe, probe.annotations) == 1.0
    assert policy.priority(probe, 1.0) == 0.25 + 1.0
    # A request waiting for the code model: engineer is no longer at risk.
    sched.submit(req("q", 2.0, model=CODE, workflow="W3", agent="engineer"), now=2.0)
    assert policy.model_queue_depth(CODE) == 1
    assert policy.idle_risk(probe, probe.annotations) == 0.75
    # A worker that reports a local queue counts as well.
    sched.update_worker(worker("r0", model=REASON, queued=2), 2.0)
    assert policy.idle_risk(probe, probe.annotations) == 0.0
    assert policy.priority(probe, 2.0) == 0.25


def test_weights_scale_each_term() -> None:
    sched = GlobalScheduler(
        PythiaPriority(PythiaPriorityConfig(completion_weight=2.0, unblock_weight=0.5)),
        PythiaCapacityRouting(),
    )
    sched.update_worker(worker("r0", model=REASON), 0.0)
    sched.submit(req("v", 0.0, model=REASON, workflow="W1", agent="verifier"), now=0.0)
    probe = req("p", ann=sys_ann(remaining=1, next_agents=(("verifier", 1.0),)), workflow="W2")
    assert sched.priority_policy.priority(probe, 0.0) == 0.0 + 2.0 * 0.5  # verifier's model has a queue
    sched.dispatch(0.0)
    assert sched.priority_policy.priority(probe, 0.0) == 2.0 * 0.5 + 0.5 * 1.0


def test_the_request_closest_to_its_workflows_end_is_placed_first() -> None:
    sched = pythia(worker("w0", max_batch=1))
    sched.submit(req("early", 0.0, workflow="A", ann=sys_ann(remaining=5)), now=0.0)
    sched.submit(req("final", 1.0, workflow="B", ann=sys_ann(remaining=0)), now=1.0)
    sched.submit(req("plain", 0.5, workflow="C"), now=1.0)
    assert placed(sched, 1.0) == [("final", "w0")]
    assert sched.complete("final", now=2.0)
    assert placed(sched, 2.0) == [("early", "w0")]


def test_untrusted_annotations_give_priority_zero() -> None:
    policy = PythiaPriority()

    def final_step(confidence: common_pb2.Confidence) -> common_pb2.SysAnnotations:
        return sys_ann(remaining=0.0, next_agents=(("verifier", 1.0),), confidence=confidence)

    assert policy.priority(req("none"), 0.0) == 0.0
    assert policy.priority(req("shadow", ann=final_step(SHADOW)), 0.0) == 0.0
    assert policy.priority(req("unknown", ann=final_step(common_pb2.CONFIDENCE_NONE)), 0.0) == 0.0
    assert policy.priority(req("high", ann=final_step(HIGH)), 0.0) == 1.0


# ---- the engine side ------------------------------------------------------------------------------


@dataclass(eq=False)
class _Seq:
    priority: float
    num_output_tokens: int = 0
    lineage: None = None


def test_aging_adds_the_rate_times_the_seconds_since_the_engine_first_ranked_the_call() -> None:
    rule = PythiaAgingRule(aging_rate=0.01)
    old, new = _Seq(0.25), _Seq(0.5)
    assert rule.effective_priority(old, 10.0) == 0.25
    assert rule.effective_priority(old, 40.0) == pytest.approx(0.55)
    assert rule.effective_priority(new, 40.0) == 0.5  # the old call now outranks the newer one
    assert GlobalScheduler.from_preset("pythia").engine_rule() is not None


def test_capacity_uses_the_block_size_the_worker_reports() -> None:
    router = PythiaCapacityRouting()
    sched = GlobalScheduler(PythiaPriority(), router)
    sched.update_worker(WorkerReport("w64", "m", "x", max_batch=4, kv_blocks_total=10, block_size=64), 0.0)
    sched.update_worker(WorkerReport("w?", "m", "x", max_batch=4, kv_blocks_total=10), 0.0)
    capacity = {w.worker_id: router.load(w).capacity_tokens for w in sched.workers()}
    assert capacity == {"w64": 640, "w?": 160}  # unreported: the configured 16 tokens a block


def test_throttle_lowers_calls_that_feed_a_bottlenecked_model_and_lifts_when_it_drains() -> None:
    """§7.2 (Fig. 9): upstream injection is throttled while a downstream model is a bottleneck: more
    calls wait for it than its workers admit.  Ranked incrementally: the flip re-ranks the reader."""
    sched = GlobalScheduler(
        PythiaPriority(PythiaPriorityConfig(throttle_weight=0.5)), PythiaCapacityRouting(), policy_name="pythia"
    )
    sched.update_worker(worker("c0", model=CODE, max_batch=2), 0.0)
    sched.update_worker(worker("r0", model=REASON, max_batch=1), 0.0)
    policy = sched.priority_policy
    assert isinstance(policy, PythiaPriority)
    sched.submit(req("v0", 0.0, model=REASON, workflow="V0", agent="verifier"), now=0.0)
    sched.dispatch(0.0)  # verifier's model is learned; r0 holds v0
    # An upstream call whose next agent is the verifier, and one that feeds nothing.
    feeds = req("feeds", 1.0, workflow="W1", agent="engineer", ann=sys_ann(remaining=1, next_agents=(("verifier", 0.8),)))
    plain = req("plain", 1.0, workflow="W2", agent="engineer", ann=sys_ann(remaining=1))
    assert policy.priority(feeds, 1.0) == pytest.approx(0.5 + 0.8)  # nothing waits for it: idle risk
    sched.submit(req("v1", 1.0, model=REASON, workflow="V1", agent="verifier"), now=1.0)
    assert policy.priority(feeds, 1.0) == 0.5  # one call waits for its one slot: neither
    sched.submit(req("v2", 1.0, model=REASON, workflow="V2", agent="verifier"), now=1.0)
    assert policy.priority(feeds, 1.0) == pytest.approx(0.5 - 0.5 * 0.8)  # two: a bottleneck
    assert policy.priority(plain, 1.0) == 0.5
    # With a code slot for one call, the call that feeds nothing goes first, then the throttled one.
    sched.update_worker(worker("c0", model=CODE, max_batch=1), 1.0)
    sched.submit(feeds, now=1.0)
    sched.submit(plain, now=1.0)
    assert [d.request_id for d in sched.dispatch(1.0) if d.worker_id == "c0"] == ["plain"]
    # The verifier's queue drains: the throttle lifts (and its idle risk then boosts the call).
    sched.complete("v0", now=2.0)
    sched.dispatch(2.0)  # v1 runs, v2 waits alone
    assert policy.priority(feeds, 2.0) == 0.5
    assert [d.request_id for d in sched.dispatch(2.0)] == []
    sched.complete("v1", now=3.0)
    sched.dispatch(3.0)  # v2 runs, nothing waits
    assert policy.priority(feeds, 3.0) == pytest.approx(0.5 + 0.8)


def test_throttle_is_off_by_default_and_on_in_the_knee_preset() -> None:
    from clairvoyant.policy.presets import PRESETS, build_policies

    assert PythiaPriorityConfig().throttle_weight == 0.0
    priority, routing = build_policies("pythia-knee")
    assert isinstance(priority, PythiaPriority) and priority.config.throttle_weight == 1.0
    assert PRESETS.create("pythia-knee")[1] == "pythia-knee"
