"""CacheManagerCore: the policy's view, directives and their bookkeeping, lifetimes, tenants,
malformed input, speculation accounting."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from clairvoyant.cachemgr.core import CacheManagerCore, CoreConfig, TierCount
from clairvoyant.core.annotations import Confidence, NextAgent, ProjectedCalls, SysAnnotations
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.core.kv_events import KvBatch, KvTier
from clairvoyant.policy.cache import CACHE_POLICIES, CacheDirective, Residency, WorkerLoad
from tests.cachemgr.factories import RecordingPolicy, batch, call, cleared, stored

pytestmark = pytest.mark.unit

L1, L2, L3 = KvTier.L1, KvTier.L2, KvTier.L3


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 32_000, n).tolist()


def core_with(
    policy: RecordingPolicy | None = None, **config: object
) -> tuple[CacheManagerCore, RecordingPolicy]:
    policy = policy or RecordingPolicy()
    core = CacheManagerCore(policy, CoreConfig(**config), policy_name="recording")  # type: ignore[arg-type]
    for worker in ("w1", "w2"):
        core.on_worker_load(WorkerLoad(worker, "m", l1_total=100, l2_total=400), 0.0)
        core.on_kv_batch(batch(worker, 1, cleared(L1), cleared(L2)), 0.0)
    return core, policy


def test_the_view_shows_workers_residency_and_a_workflows_blocks() -> None:
    core, _ = core_with()
    prompt = chain_hashes(tokens(1, 6 * BLOCK_TOKENS))
    core.on_kv_batch(batch("w1", 2, stored(prompt[:3], workflow_id="wf", agent_id="a", request_id="r1")), 1.0)
    core.on_kv_batch(batch("w2", 2, stored(prompt[:5], L3)), 1.0)
    core.on_kv_batch(batch("w9", 1, cleared(L1), model="other"), 1.0)  # heard from by events only
    assert [w.worker_id for w in core.view.workers("m")] == ["w1", "w2"]
    assert [w.worker_id for w in core.view.workers("")] == ["w1", "w2", "w9"]
    assert core.view.workers("other") == [WorkerLoad("w9", "other")]
    assert core.view.residency("t", "m", prompt) == [Residency("w1", 3, 3, 5), Residency("w2", 0, 0, 5)]
    core.speculate("w2", "t", prompt[:2], 2.0)
    assert core.view.residency("t", "m", prompt) == [Residency("w1", 3, 3, 5), Residency("w2", 2, 2, 5)]
    core.tick(4.0)  # the speculative entries' 2 s ran out
    assert core.view.residency("t", "m", prompt)[1] == Residency("w2", 0, 0, 5)
    assert [(w, tier, b.block_hash) for w, tier, b in core.view.blocks("t", "wf")] == [
        ("w1", 1, prompt[0]),
        ("w2", 3, prompt[0]),
        ("w1", 1, prompt[1]),
        ("w2", 3, prompt[1]),
        ("w1", 1, prompt[2]),
        ("w2", 3, prompt[2]),
    ]
    core.on_worker_gone("w2")
    assert core.view.residency("t", "m", prompt) == [Residency("w1", 3, 3, 3)]
    core.check_integrity()


def test_a_completion_is_recorded_before_the_policy_sees_it_and_its_directives_are_kept() -> None:
    drop = CacheDirective("drop", "w1", "t", workflow_id="wf", agent_id="a")
    retain = CacheDirective("retain", "w2", "t", workflow_id="wf", ttl_s=5.0)
    policy = RecordingPolicy(on_completion_answers=[[drop], [retain, drop]])
    core, _ = core_with(policy, recent_directives=2)
    assert core.on_completion(
        call("r1", tokens(1, 40), tokens(2, 10), workflow_id="wf", agent_id="a"), 1.0
    ) == [drop]
    assert core.on_completion(
        call("r2", tokens(3, 40), tokens(4, 10), workflow_id="wf", agent_id="b", start=1.5), 2.0
    ) == [retain, drop]
    assert policy.completions == [("r1", ("a",)), ("r2", ("a", "b"))]
    assert core.plan() == [retain, drop]  # the ring keeps the two most recent
    assert core.plan("w2") == [retain]
    stats = core.stats()
    assert (stats.directives_issued, stats.directives_by_kind) == (3, (("drop", 2), ("retain", 1)))
    assert (stats.completions_seen, stats.live_workflows, stats.policy) == (2, 1, "recording")


def test_workflow_end_forgets_after_the_policy_ran_and_idle_workflows_expire() -> None:
    core, policy = core_with(workflow_idle_ttl_s=10.0)
    core.on_completion(call("a1", tokens(1, 32), [], workflow_id="A"), 1.0)
    core.on_completion(call("b1", tokens(2, 32), [], workflow_id="B"), 2.0)
    core.on_completion(call("a2", tokens(3, 32), [], workflow_id="A", start=2.0, workflow_end=True), 3.0)
    assert policy.completions[-1] == ("a2", ("a", "a"))  # it still saw A's history
    assert policy.forgotten == [("t", "A")]
    assert core.view.history_agents("t", "A") == []
    assert core.tick(11.9) == [] and policy.forgotten == [("t", "A")]
    core.tick(12.0)
    assert policy.forgotten == [("t", "A"), ("t", "B")]
    assert policy.ticks == [11.9, 12.0]
    assert (core.stats().live_workflows, core.stats().history_bytes) == (0, core.history.static_nbytes)


def test_the_history_byte_cap_makes_the_policy_forget_the_evicted_workflow() -> None:
    core, policy = core_with(history_max_bytes=1000)
    core.on_completion(call("a1", tokens(1, 160), [], workflow_id="A"), 1.0)  # 640 + 80 bytes
    core.on_completion(call("b1", tokens(2, 160), [], workflow_id="B"), 2.0)
    assert policy.forgotten == [("t", "A")]
    assert core.stats().live_workflows == 1


def test_tenants_never_see_each_others_blocks_or_history() -> None:
    core, _ = core_with()
    system = tokens(0, 64)
    first = call(
        "a1", system + tokens(1, 40), tokens(2, 20), tenant="acme", workflow_id="wf", agent_id="coder"
    )
    core.on_completion(first, 1.0)
    core.on_completion(call("a2", system + tokens(3, 40), [], tenant="acme", workflow_id="wf2"), 1.0)
    hashes = list(first.prompt_block_hashes)
    core.on_kv_batch(batch("w1", 2, stored(hashes, tenant="acme", workflow_id="wf", request_id="a1")), 2.0)
    # The request that computed a block is 104 + 20 tokens long.
    assert {use.tokens for _, _, use in core.view.blocks("acme", "wf")} == {124}
    template = "${coder[-1]:prompt:[0,$]}${new}"
    assert core.view.assemble("acme", "wf", template) == first.prompt_token_ids
    assert core.view.assemble("other", "wf", template) is None
    assert core.view.history_agents("other", "wf") == []
    assert core.view.blocks("other", "wf") == []
    assert core.view.residency("other", "m", hashes) == [Residency("w1", 0, 0, 0), Residency("w2", 0, 0, 0)]
    assert core.view.residency("acme", "m", hashes)[0] == Residency("w1", 6, 6, 6)
    # The shared system prompt: one other live workflow of acme holds it; none of another tenant.
    assert core.view.references("acme", hashes[0]) == 1
    assert core.view.references("other", hashes[0]) == 0
    assert core.view.references("acme", hashes[5]) == 0  # only its own workflow's


def test_cross_tenant_sharing_lets_references_count_other_tenants() -> None:
    system = tokens(0, 64)
    for sharing, expected in [(False, 0), (True, 1)]:
        core, _ = core_with(cross_tenant_sharing=sharing)
        core.on_completion(call("x", system, [], tenant="acme", workflow_id="wf"), 1.0)
        assert core.view.references("other", chain_hashes(system)[0]) == expected


def test_static_sources_need_the_agent() -> None:
    core, _ = core_with()
    system = tokens(0, 170)
    for n in range(2):
        core.on_completion(
            call(f"r{n}", system + tokens(n + 1, 30), [], workflow_id=f"w{n}", agent_id="planner"), 1.0
        )
    assert core.assemble("t", "w1", "${static:[0,$]}${new}", agent_id="planner") == tuple(system[:160])
    assert core.assemble("t", "w1", "${static:[0,$]}${new}") is None  # which agent's prefix: unknown
    assert core.assemble("t", "w1", "${static:[0,$]}${new}", agent_id="coder") is None


def test_malformed_input_is_counted_and_dropped_never_raised() -> None:
    impossible = CacheDirective("pre_prefill", "w1", "t", token_ids=(1 << 32,), speculative=True)
    core, policy = core_with(RecordingPolicy(on_tick_answers=[[impossible]]))
    assert core.tick(1.0) == []
    core.on_kv_batch(KvBatch("", "m", 16, 1), 1.0)
    core.on_kv_batch(KvBatch("w1", "m", 16, 2, (stored([1 << 64]),)), 1.0)
    bad_time = call("r1", tokens(1, 32), [], start=math.nan)
    bad_order = call("r2", tokens(1, 32), [], start=5.0, end=4.0)
    bad_token = replace(call("r3", tokens(1, 32), []), prompt_token_ids=(-1,) * 32)
    assert [core.on_completion(c, 1.0) for c in (bad_time, bad_order, bad_token)] == [[], [], []]
    assert core.view.assemble("t", "w1", "${coder[-1]:prompt}${new}") is None
    core.speculate("w1", "t", [-5], 1.0)
    core.on_worker_load(WorkerLoad("", "m"), 1.0)
    core.note_malformed("hint")
    stats = core.stats()
    assert (stats.malformed_dropped, stats.completions_seen, stats.events_seen) == (10, 0, 4)
    assert policy.completions == []
    assert core.malformed == {
        "kv_batch": 2,
        "completion": 3,
        "template": 1,
        "speculate": 1,
        "worker_load": 1,
        "hint": 1,
        "directive": 1,
    }
    assert (stats.directives_issued, stats.speculative_tokens, core.plan()) == (0, 0, [])


def test_speculative_tokens_used_by_a_later_call_and_wasted_when_the_workflow_goes() -> None:
    next_prompt = tokens(1, 100)  # 6 full blocks + 4 tokens
    guess_right = CacheDirective(
        "pre_prefill", "w1", "t", workflow_id="A", token_ids=tuple(next_prompt), speculative=True
    )
    wrong = tokens(2, 64)
    guess_wrong = CacheDirective(
        "promote", "w2", "t", workflow_id="B", token_ids=tuple(wrong), speculative=True
    )
    half = CacheDirective(
        "pre_prefill", "w1", "t", workflow_id="B", token_ids=tuple(tokens(3, 32)), speculative=True
    )
    plain = CacheDirective("retain", "w1", "t", workflow_id="A", ttl_s=3.0)
    policy = RecordingPolicy(on_completion_answers=[[guess_right, plain], [guess_wrong, half]])
    core, _ = core_with(policy, workflow_idle_ttl_s=50.0)
    core.on_completion(call("a1", tokens(9, 40), [], workflow_id="A"), 1.0)
    core.on_completion(call("b1", tokens(8, 40), [], workflow_id="B"), 2.0)
    assert core.stats().speculative_tokens == 100 + 64 + 32
    # A's next call uses the whole pre-prefilled prompt; another tenant's identical prompt counts nothing.
    core.on_completion(call("x", next_prompt + tokens(4, 20), [], tenant="other", workflow_id="X"), 3.0)
    assert core.stats().speculative_used_tokens == 0
    core.on_completion(call("a2", next_prompt + tokens(4, 20), [], workflow_id="A", start=3.0), 4.0)
    # B's next call shares 1 of the 2 blocks of ``half``: 16 tokens used.
    core.on_completion(call("b2", tokens(3, 16) + tokens(5, 40), [], workflow_id="B", start=4.0), 5.0)
    stats = core.stats()
    assert (stats.speculative_used_tokens, stats.speculative_wasted_tokens) == (116, 0)
    core.on_completion(call("b3", [], [], workflow_id="B", start=5.0, workflow_end=True), 6.0)
    stats = core.stats()
    assert (stats.speculative_used_tokens, stats.speculative_wasted_tokens) == (116, 64 + 16)
    core.tick(60.0)  # A expires: its speculation was used in full, nothing more is wasted
    assert core.stats().speculative_wasted_tokens == 80
    assert core.speculation.totals().pending == 0
    core.check_integrity()


def test_a_speculation_without_a_live_workflow_is_wasted_after_the_idle_ttl() -> None:
    staged = CacheDirective("pre_prefill", "w1", "t", token_ids=tuple(tokens(1, 48)), speculative=True)
    core, _ = core_with(RecordingPolicy(on_tick_answers=[[staged]]), workflow_idle_ttl_s=30.0)
    core.tick(1.0)
    core.tick(30.9)
    assert core.stats().speculative_wasted_tokens == 0
    core.tick(31.0)
    assert (core.stats().speculative_tokens, core.stats().speculative_wasted_tokens) == (48, 48)


def test_tier_counts_sum_the_heartbeats_and_the_shared_blocks() -> None:
    core, _ = core_with()
    core.on_worker_load(
        WorkerLoad("w1", "m", l1_used=10, l1_total=100, l2_used=5, l2_total=400, hit_tokens=(64, 32, 16)), 1.0
    )
    core.on_worker_load(WorkerLoad("w2", "m", l1_used=20, l1_total=100, hit_tokens=(16, 0, 0)), 1.0)
    core.on_kv_batch(batch("w1", 2, stored([1, 2, 3], L3)), 1.0)
    core.on_kv_batch(batch("w2", 2, stored([2, 3, 4], L3)), 1.0)
    core.on_completion(call("r", tokens(1, 200), [], workflow_id=""), 1.0)  # 200 prompt tokens completed
    assert core.stats().tiers == (
        TierCount(1, 30, 200, 80, 120),
        TierCount(2, 5, 400, 32, 88),
        TierCount(3, 4, 0, 16, 72),
    )
    assert (core.stats().indexed_blocks, core.stats().workers) == (4, 2)


def test_the_lru_policy_issues_nothing_and_the_core_still_keeps_history() -> None:
    core = CacheManagerCore(CACHE_POLICIES.create("lru"), policy_name="lru")
    assert core.on_completion(call("r1", tokens(1, 48), tokens(2, 16), agent_id="coder"), 1.0) == []
    assert core.tick(2.0) == []
    assert core.view.assemble(
        "t", "w1", "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}"
    ) == tuple(tokens(1, 48) + tokens(2, 16))
    assert (core.stats().policy, core.stats().directives_issued) == ("lru", 0)


@pytest.mark.parametrize("name", CACHE_POLICIES.names())
def test_every_policy_runs_on_the_core_within_its_tenant_and_the_books_balance(name: str) -> None:
    """Two tenants' conversations (planner -> coder x3) with the profiler's annotations, their KV
    events and ticks, through each registered policy: every directive stays in its call's tenant
    and names a known worker, the core stays consistent, and once every workflow is gone each
    speculative token is either used or wasted."""
    core = CacheManagerCore(
        CACHE_POLICIES.create(name), CoreConfig(workflow_idle_ttl_s=100.0), policy_name=name
    )
    template = "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}"
    annotations = SysAnnotations(
        confidence=Confidence.HIGH,
        predicted_path_regex="planner -> (coder){3}",
        next_agents=(NextAgent("coder", 0.9),),
        prompt_composition=template,
        expected_remaining_steps=2.0,
        expected_remaining_time_s=5.0,
        projection=(ProjectedCalls(1, "coder", 1.0),),
    )
    sequence = {"w1": 1, "w2": 1}
    for worker in sequence:
        core.on_worker_load(WorkerLoad(worker, "m", l1_total=1000, l2_total=4000, has_l3=True), 0.0)
        core.on_kv_batch(batch(worker, 1, cleared(L1), cleared(L2)), 0.0)
    now = 1.0
    for n in range(4):
        for tenant in ("acme", "beta"):
            worker = f"w{1 + n % 2}"
            prompt, reply = tokens(100 * n + len(tenant), 70), tokens(100 * n + 7, 40)
            for step, agent in enumerate(["planner", "coder", "coder", "coder"]):
                done = call(
                    f"{tenant}-{n}-{step}",
                    prompt,
                    reply,
                    tenant=tenant,
                    workflow_id=f"wf{n}",
                    agent_id=agent,
                    start=now,
                    worker_id=worker,
                    workflow_end=step == 3,
                )
                done = replace(done, annotations=annotations, end=now + 0.5)
                sequence[worker] += 1
                chain = list(done.prompt_block_hashes)  # the engine kept the prompt, not the reply
                event = stored(
                    chain, tenant=tenant, workflow_id=f"wf{n}", agent_id=agent, request_id=done.request_id
                )
                core.on_kv_batch(batch(worker, sequence[worker], event), now + 0.5)
                directives = core.on_completion(done, now + 0.6) + core.tick(now + 0.7)
                assert {d.tenant for d in directives} <= {tenant}, directives
                assert {d.worker_id for d in directives} <= set(sequence), directives
                core.check_integrity()
                prompt, reply = prompt + reply + tokens(int(now * 13), 20), tokens(int(now * 17), 40)
                now += 1.0
    core.tick(now + 1000.0)
    stats = core.stats()
    assert (stats.completions_seen, stats.live_workflows, stats.malformed_dropped) == (32, 0, 0)
    assert stats.speculative_used_tokens + stats.speculative_wasted_tokens == stats.speculative_tokens
    core.check_integrity()


def test_a_pre_prefill_counts_as_held_on_its_worker_until_the_worker_confirms_or_the_ttl_runs_out() -> None:
    staged = tokens(7, 3 * BLOCK_TOKENS)
    chain = chain_hashes(staged)
    policy = RecordingPolicy(
        on_completion_answers=[[CacheDirective("pre_prefill", "w2", "t", token_ids=tuple(staged), speculative=True)]]
    )
    core, _ = core_with(policy)
    core.on_completion(call("a1", tokens(9, 40), [], workflow_id="A"), 1.0)
    assert core.view.residency("t", "m", chain)[1] == Residency("w2", 3, 3, 3)  # held ahead of its event
    core.tick(3.5)  # 2 s of speculative TTL ran out with no STORED from w2
    assert core.view.residency("t", "m", chain)[1] == Residency("w2", 0, 0, 0)
