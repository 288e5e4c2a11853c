"""The KV block index fed by the workers' KV events, and sglang-gw's precise matching through it."""

from __future__ import annotations

import pytest

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.scheduler.core import (
    GlobalScheduler,
    KvBatch,
    KvBlockEvent,
    KvEventKind,
    KvIndex,
    KvTier,
    QueuedRequest,
    TierWeights,
    WorkerReport,
)

pytestmark = pytest.mark.unit

STORED, REMOVED, CLEARED = KvEventKind.STORED, KvEventKind.REMOVED, KvEventKind.CLEARED
PROMPT = chain_hashes(list(range(8 * BLOCK_TOKENS)))  # 8 blocks


def stored(hashes: list[int], tier: KvTier = KvTier.L1, tenant: str = "t", session: str = "") -> KvBlockEvent:
    return KvBlockEvent(STORED, tier, tenant, tuple(hashes), session)


def removed(hashes: list[int], tier: KvTier = KvTier.L1, tenant: str = "t") -> KvBlockEvent:
    return KvBlockEvent(REMOVED, tier, tenant, tuple(hashes))


def cleared(tier: KvTier = KvTier.L1) -> KvBlockEvent:
    return KvBlockEvent(CLEARED, tier)


def batch(
    worker: str, sequence: int, *events: KvBlockEvent, model: str = "m", block_size: int = 16
) -> KvBatch:
    return KvBatch(worker, model, block_size, sequence, events)


def request(
    hashes: list[int] | None = None, *, session: str | None = None, tenant: str = "t", prompt: int = 0
) -> QueuedRequest:
    meta = None if session is None else AppMetadata("wf", session, "agent")
    return QueuedRequest(
        "r",
        tenant,
        "m",
        0.0,
        prompt_tokens=prompt,
        app_metadata=meta,
        prompt_block_hashes=tuple(hashes or ()),
    )


def blocks(index: KvIndex, req: QueuedRequest, now: float = 0.0) -> dict[str, float] | None:
    cached = index.cached_tokens(req, now)
    index.check_integrity()
    return None if cached is None else {w: round(t / BLOCK_TOKENS, 6) for w, t in cached.items()}


def test_no_events_no_answer_so_routing_keeps_its_own_estimate() -> None:
    index = KvIndex()
    assert blocks(index, request(PROMPT)) is None
    index.apply(batch("w1", 1, cleared()), 0.0)
    assert blocks(index, request(PROMPT)) == {"w1": 0.0}
    assert index.cached_tokens(QueuedRequest("r", "t", "other-model", 0.0), 0.0) is None


def test_stored_then_removed_gives_the_leading_run() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, cleared(), stored(PROMPT[:5])), 0.0)
    index.apply(batch("w2", 1, cleared(), stored(PROMPT[:2] + PROMPT[3:8])), 0.0)
    assert blocks(index, request(PROMPT)) == {"w1": 5.0, "w2": 2.0}  # w2 misses block 2: its run stops
    index.apply(batch("w1", 2, removed(PROMPT[1:2])), 0.0)
    assert blocks(index, request(PROMPT)) == {"w1": 1.0, "w2": 2.0}
    assert blocks(index, request(PROMPT, tenant="other")) == {"w1": 0.0, "w2": 0.0}  # tenants never share


def test_cleared_empties_one_tier_only() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, stored(PROMPT[:2]), stored(PROMPT[2:4], KvTier.L2)), 0.0)
    index.apply(batch("w1", 2, cleared(KvTier.L1)), 0.0)
    assert not index.holds("w1", KvTier.L1, "t", PROMPT[0])
    assert index.holds("w1", KvTier.L2, "t", PROMPT[2])
    assert blocks(index, request(PROMPT)) == {"w1": 0.0}  # block 0 is gone: no leading run


def test_tier_weights_l1_l2_and_l3_shared_by_the_model() -> None:
    index = KvIndex(TierWeights(l1=1.0, l2=0.8, l3=0.5))
    index.apply(batch("w1", 1, stored(PROMPT[:2]), stored(PROMPT[2:3], KvTier.L2)), 0.0)
    index.apply(batch("w2", 1, stored(PROMPT[3:4], KvTier.L3)), 0.0)  # shared storage
    index.apply(batch("w3", 1, stored(PROMPT[:1], KvTier.L3), model="other"), 0.0)  # another model's
    # w1: 1 + 1 + 0.8 + 0.5 (block 3 from L3, seen by every worker of the model); w2: block 0 missing.
    assert blocks(index, request(PROMPT)) == {"w1": 3.3, "w2": 0.0}
    index.apply(batch("w2", 2, stored(PROMPT[:1], KvTier.L2)), 0.0)
    assert blocks(index, request(PROMPT)) == {"w1": 3.3, "w2": 0.8}  # block 1 is nowhere for w2
    index.remove_worker("w2")  # its L3 reports go with it
    assert blocks(index, request(PROMPT)) == {"w1": 2.8}


def test_the_best_tier_counts_when_a_block_is_in_several() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, stored(PROMPT[:2], KvTier.L2), stored(PROMPT[:1])), 0.0)
    assert blocks(index, request(PROMPT)) == {"w1": 1.8}


def test_a_sequence_gap_makes_the_worker_stale_until_its_next_cleared() -> None:
    index = KvIndex()
    assert not index.apply(batch("w1", 1, cleared(), stored(PROMPT[:4])), 0.0).gap
    applied = index.apply(batch("w1", 3, stored(PROMPT[4:6])), 0.0)  # batch 2 was lost
    assert applied.gap and applied.stale and index.is_stale("w1")
    assert blocks(index, request(PROMPT)) is None  # no fresh worker of the model: no answer
    index.apply(batch("w2", 1, stored(PROMPT[:1])), 0.0)
    assert blocks(index, request(PROMPT)) == {"w2": 1.0}  # the stale worker is left out
    index.apply(batch("w1", 4, stored(PROMPT[:8])), 0.0)  # ignored while stale
    assert not index.holds("w1", KvTier.L1, "t", PROMPT[0])
    applied = index.apply(batch("w1", 5, cleared(), stored(PROMPT[:3])), 0.0)  # rebuilt from here
    assert not applied.gap and not applied.stale
    assert blocks(index, request(PROMPT)) == {"w1": 3.0, "w2": 1.0}


def test_a_restarted_worker_starts_from_its_cleared() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, cleared(), stored(PROMPT[:4])), 0.0)
    index.apply(batch("w1", 2), 0.0)
    applied = index.apply(batch("w1", 1, cleared(), cleared(KvTier.L2)), 0.0)  # restart: sequence 1 again
    assert applied.gap and not applied.stale
    assert blocks(index, request(PROMPT)) == {"w1": 0.0}


def test_session_blocks_without_prompt_hashes() -> None:
    index = KvIndex()
    index.apply(
        batch("w1", 1, stored(PROMPT[:3], session="A"), stored(PROMPT[3:4], KvTier.L2, session="A")), 0.0
    )
    index.apply(batch("w2", 1, stored(PROMPT[:1], session="A"), stored(PROMPT[4:6], session="B")), 0.0)
    assert blocks(index, request(session="A")) == {"w1": 3.8, "w2": 1.0}
    assert blocks(index, request(session="B")) == {"w1": 0.0, "w2": 2.0}
    index.apply(batch("w1", 2, removed(PROMPT[:2])), 0.0)
    assert blocks(index, request(session="A")) == {"w1": 1.8, "w2": 1.0}
    assert blocks(index, request()) == {}  # no hashes and no session: nothing to match


def test_speculative_entries_expire_unless_a_stored_confirms_them() -> None:
    index = KvIndex(speculative_ttl_s=2.0)
    index.apply(batch("w1", 1, cleared()), 0.0)
    assert index.speculate("w1", request(PROMPT[:4]), now=10.0) == 4
    assert index.speculate("unknown", request(PROMPT[:4]), now=10.0) == 0  # never creates a worker
    assert blocks(index, request(PROMPT), now=11.0) == {"w1": 4.0}
    assert index.apply(batch("w1", 2, stored(PROMPT[:2])), 11.5).confirmed == 2
    assert blocks(index, request(PROMPT), now=12.0) == {"w1": 2.0}  # blocks 2-3 expired at 12.0
    assert index.expire(12.0) == 2
    assert blocks(index, request(PROMPT), now=30.0) == {"w1": 2.0}  # the confirmed ones stay


def test_a_speculated_worker_that_goes_stale_loses_its_speculation() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, cleared()), 0.0)
    index.speculate("w1", request(PROMPT[:4]), now=0.0)
    index.apply(batch("w1", 5), 0.1)
    index.apply(batch("w1", 6, cleared()), 0.2)
    assert blocks(index, request(PROMPT), now=0.3) == {"w1": 0.0}


def test_workers_of_another_block_size_are_not_matched_by_prompt_hashes() -> None:
    index = KvIndex()
    index.apply(batch("w1", 1, stored(PROMPT[:2]), block_size=32), 0.0)
    index.apply(batch("w2", 1, stored(PROMPT[:1])), 0.0)
    assert blocks(index, request(PROMPT)) == {"w2": 1.0}


# ---- the scheduler: sglang-gw routes by the index -----------------------------------------------


def scheduler(workers: int = 2) -> GlobalScheduler:
    sched = GlobalScheduler.from_preset("sglang-gw")
    for i in range(1, workers + 1):
        sched.update_worker(WorkerReport(f"w{i}", "m", f"w{i}:1", max_batch=4), now=0.0)
    return sched


def place(sched: GlobalScheduler, req: QueuedRequest, now: float) -> str:
    sched.submit(req, now)
    decisions = sched.dispatch(now)
    sched.check_integrity()
    sched.kv_index.check_integrity()
    assert len(decisions) == 1
    return decisions[0].worker_id


def call(rid: str, hashes: list[int], now: float, session: str | None = None) -> QueuedRequest:
    meta = None if session is None else AppMetadata("wf", session, "agent")
    return QueuedRequest(
        rid, "t", "m", now, prompt_tokens=len(hashes) * BLOCK_TOKENS, app_metadata=meta,
        prompt_block_hashes=tuple(hashes),
    )  # fmt: skip


def test_sglang_gw_prefers_the_worker_holding_the_longer_prefix() -> None:
    sched = scheduler()
    sched.apply_kv_events(batch("w1", 1, cleared(), stored(PROMPT[:2])), 0.0)
    sched.apply_kv_events(batch("w2", 1, cleared(), stored(PROMPT[:6])), 0.0)
    assert place(sched, call("a", PROMPT, 1.0), 1.0) == "w2"  # 6/8 on w2 beats 2/8 on w1
    assert place(sched, call("b", PROMPT, 1.1), 1.1) == "w2"  # and again, now also speculated there


def test_sglang_gw_speculates_the_placed_prompt_until_events_confirm_it() -> None:
    sched = scheduler()
    sched.apply_kv_events(batch("w1", 1, cleared()), 0.0)
    sched.apply_kv_events(batch("w2", 1, cleared()), 0.0)
    # Nothing cached anywhere: the smallest tree (w1); its blocks are speculated there ...
    assert place(sched, call("a", PROMPT, 1.0), 1.0) == "w1"
    # ... so the next call with the same prompt follows it before any STORED arrives,
    assert place(sched, call("b", PROMPT, 1.5), 1.5) == "w1"
    # but after the speculation expired without a STORED, w1 holds nothing: the smaller tree wins.
    assert place(sched, call("c", PROMPT, 10.0), 10.0) == "w2"


def test_sglang_gw_matches_sessions_by_their_reported_blocks_without_hashes() -> None:
    sched = scheduler()
    sched.apply_kv_events(batch("w1", 1, cleared(), stored(PROMPT[:1], session="A")), 0.0)
    sched.apply_kv_events(batch("w2", 1, cleared(), stored(PROMPT[:5], session="A")), 0.0)
    req = QueuedRequest("a", "t", "m", 1.0, prompt_tokens=100, app_metadata=AppMetadata("wf", "A", "agent"))
    assert place(sched, req, 1.0) == "w2"


def test_sglang_gw_is_unchanged_while_no_worker_of_the_model_publishes() -> None:
    fed, silent = scheduler(), scheduler()
    fed.apply_kv_events(batch("x1", 1, cleared(), stored(PROMPT), model="other"), 0.0)  # another model's
    for i, session in enumerate(["A", "B", "A", "C", "B", "A"]):
        req = call(f"r{i}", PROMPT[: 2 + i], float(i), session)
        assert place(fed, req, float(i)) == place(silent, req, float(i))
    assert silent.kv_index.workers() == []  # placing speculates only on workers that publish


def test_a_removed_worker_leaves_the_index() -> None:
    sched = scheduler()
    sched.apply_kv_events(batch("w1", 1, cleared(), stored(PROMPT[:2])), 0.0)
    sched.remove_worker("w1")
    assert sched.kv_index.workers() == []
