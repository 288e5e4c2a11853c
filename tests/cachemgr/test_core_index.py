"""The cache manager's cluster index: holdings from KV events, lineage, speculation, the entry cap."""

from __future__ import annotations

import random

import pytest

from clairvoyant.cachemgr.core.index import ClusterIndex, batch_problem
from clairvoyant.contracts.v1 import cachemgr_pb2, worker_pb2
from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.core.wire import kv_batch
from clairvoyant.policy.cache import Residency
from tests.cachemgr.factories import batch, cleared, removed, stored

pytestmark = pytest.mark.unit

PROMPT = chain_hashes(list(range(8 * BLOCK_TOKENS)))  # 8 blocks
L1, L2, L3 = KvTier.L1, KvTier.L2, KvTier.L3


def fresh_index(*workers: str, model: str = "m", **kwargs: float) -> ClusterIndex:
    index = ClusterIndex(**kwargs)  # type: ignore[arg-type]
    for worker in workers:
        index.apply(batch(worker, 1, cleared(L1), cleared(L2), model=model), 0.0)
    return index


def test_stored_removed_cleared_and_the_tier_of_a_block() -> None:
    index = fresh_index("w1")
    index.apply(batch("w1", 2, stored(PROMPT[:4]), stored(PROMPT[4:6], L2)), 1.0)
    assert [index.tier_of("w1", "t", h) for h in PROMPT[:7]] == [1, 1, 1, 1, 2, 2, None]
    index.apply(batch("w1", 3, removed(PROMPT[2:4]), stored(PROMPT[2:3], L2)), 2.0)
    assert [index.tier_of("w1", "t", h) for h in PROMPT[:6]] == [1, 1, 2, None, 2, 2]
    assert (index.kv.distinct_blocks, index.entries) == (5, 5)
    index.apply(batch("w1", 4, cleared(L2)), 3.0)
    assert [index.tier_of("w1", "t", h) for h in PROMPT[:6]] == [1, 1, None, None, None, None]
    assert (index.kv.distinct_blocks, index.entries) == (2, 2)
    index.check_integrity()


def test_a_sequence_gap_drops_the_worker_until_a_cleared() -> None:
    index = fresh_index("w1")
    index.apply(batch("w1", 2, stored(PROMPT[:4])), 1.0)
    applied = index.apply(batch("w1", 4, stored(PROMPT[4:6])), 2.0)  # batch 3 was lost
    assert (applied.gap, applied.stale) == (True, True)
    assert index.entries == 0
    assert index.residency("t", ["w1"], PROMPT, 2.0) == [Residency("w1", 0, 0, 0)]
    index.apply(batch("w1", 5, cleared(L1), stored(PROMPT[:2])), 3.0)
    assert index.residency("t", ["w1"], PROMPT, 3.0) == [Residency("w1", 2, 2, 2)]
    index.expire(3.0)  # the lineage of blocks lost in the gap goes too
    index.check_integrity()


def test_residency_leading_runs_per_tier_and_l3_for_every_worker_of_the_model() -> None:
    index = fresh_index("w1", "w2")
    index.apply(batch("w3", 1, cleared(L1), model="other"), 0.0)
    # w1: h0 h1 in L1, h2 in L2, h3 in L1, h4 nowhere.  w2 wrote h0..h5 to shared storage.
    index.apply(batch("w1", 2, stored(PROMPT[:2]), stored(PROMPT[2:3], L2), stored(PROMPT[3:4])), 1.0)
    index.apply(batch("w2", 2, stored(PROMPT[:6], L3)), 1.0)
    assert index.residency("t", ["w1", "w2"], PROMPT, 1.0) == [
        Residency("w1", 2, 4, 6),  # L1 run stops at h2 (L2); L2 run at h4 (only in L3)
        Residency("w2", 0, 0, 6),
    ]
    # Shared storage is per model: a worker of another model does not see it.
    assert index.residency("t", ["w3"], PROMPT, 1.0) == [Residency("w3", 0, 0, 0)]
    # ...and per tenant.
    assert index.residency("u", ["w1", "w2"], PROMPT, 1.0) == [
        Residency("w1", 0, 0, 0),
        Residency("w2", 0, 0, 0),
    ]
    assert index.kv.shared_blocks == 6


def test_speculative_entries_expire_unless_a_stored_confirms_them() -> None:
    index = fresh_index("w1", "w2", speculative_ttl_s=2.0)
    assert index.speculate("w1", "t", PROMPT[:3], 10.0) == 3
    assert index.speculate("w2", "t", PROMPT[:3], 10.0) == 3
    assert index.residency("t", ["w1"], PROMPT, 11.0) == [Residency("w1", 3, 3, 3)]
    applied = index.apply(batch("w1", 2, stored(PROMPT[:3])), 11.5)
    assert applied.confirmed == 3
    index.expire(12.0)
    assert index.residency("t", ["w1", "w2"], PROMPT, 12.0) == [
        Residency("w1", 3, 3, 3),
        Residency("w2", 0, 0, 0),
    ]
    assert index.tier_of("w2", "t", PROMPT[0]) is None


def test_lineage_of_stored_blocks_and_a_workflows_blocks() -> None:
    index = fresh_index("w1", "w2")
    index.apply(
        batch(
            "w1",
            2,
            stored(PROMPT[:2], workflow_id="wf", agent_id="planner", request_id="r1"),
            stored(PROMPT[2:3], workflow_id="wf", agent_id="planner", request_id="r1", response=True),
        ),
        1.0,
    )
    index.apply(batch("w2", 2, stored(PROMPT[:1], L2, workflow_id="other")), 2.0)  # first lineage wins
    blocks = index.workflow_blocks("t", "wf")
    assert [(w, tier, use.block_hash, use.response) for w, tier, use in blocks] == [
        ("w1", 1, PROMPT[0], False),
        ("w2", 2, PROMPT[0], False),
        ("w1", 1, PROMPT[1], False),
        ("w1", 1, PROMPT[2], True),
    ]
    use = blocks[0][2]
    assert (use.agent_id, use.request_id, use.last_access) == ("planner", "r1", 2.0)
    index.touch("t", PROMPT[:2], 5.0, hits=1)
    assert index.lineage_of("t", PROMPT[0]).hits == 1
    assert index.lineage_of("t", PROMPT[1]).last_access == 5.0
    assert index.workflow_blocks("u", "wf") == []  # another tenant's query sees nothing
    index.apply(batch("w1", 3, removed(PROMPT[:3])), 6.0)
    assert [(w, use.block_hash) for w, _, use in index.workflow_blocks("t", "wf")] == [("w2", PROMPT[0])]
    index.check_integrity()


def test_the_entry_cap_keeps_a_chains_head_and_counts_the_rest() -> None:
    index = fresh_index("w1", "w2", max_entries=5)
    index.apply(batch("w1", 2, stored(PROMPT[:4], workflow_id="wf")), 1.0)
    index.apply(batch("w2", 2, stored(PROMPT[:4], workflow_id="wf")), 1.0)
    assert (index.entries, index.refused) == (5, 3)
    assert index.residency("t", ["w1", "w2"], PROMPT, 1.0) == [
        Residency("w1", 4, 4, 4),
        Residency("w2", 1, 1, 1),
    ]
    index.apply(batch("w1", 3, stored(PROMPT[:2])), 2.0)  # re-storing held blocks needs no room
    assert index.refused == 3
    index.apply(batch("w1", 4, removed(PROMPT[2:4])), 3.0)
    index.apply(batch("w2", 3, stored(PROMPT[1:4])), 4.0)
    assert (index.entries, index.refused) == (5, 4)
    index.check_integrity()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (KvBatch("", "m", 16, 1), "worker_id"),
        (KvBatch("w", "m", 16, -1), "unsigned"),
        (KvBatch("w", "m", 16, 1, (KvBlockEvent(KvEventKind.CLEARED, L1, "t", (1,)),)), "CLEARED"),
        (KvBatch("w", "m", 16, 1, (KvBlockEvent(KvEventKind.STORED, L1, "t", (1 << 64,)),)), "64-bit"),
    ],
)
def test_batch_contract(bad: KvBatch, why: str) -> None:
    assert why in batch_problem(bad)
    assert batch_problem(batch("w", 1, stored(PROMPT))) == ""


def test_the_wire_decoder_fills_the_lineage_fields() -> None:
    msg = worker_pb2.KvEventBatch(
        worker_id="w1",
        model="m",
        block_size=16,
        sequence=7,
        events=[
            worker_pb2.KvEvent(kind=worker_pb2.KvEvent.CLEARED, tier=cachemgr_pb2.CACHE_TIER_L2),
            worker_pb2.KvEvent(
                kind=worker_pb2.KvEvent.STORED,
                tier=cachemgr_pb2.CACHE_TIER_L1,
                tenant="t",
                block_hashes=PROMPT[1:3],
                parent_hash=PROMPT[0],
                lineage=cachemgr_pb2.LineageSelector(
                    tenant="t", workflow_id="wf", agent_id="a", request_id="r"
                ),
                response=True,
            ),
        ],
    )
    assert kv_batch(msg) == KvBatch(
        "w1",
        "m",
        16,
        7,
        (
            KvBlockEvent(KvEventKind.CLEARED, L2),
            KvBlockEvent(KvEventKind.STORED, L1, "t", tuple(PROMPT[1:3]), "wf", "a", "r", True, PROMPT[0]),
        ),
    )
    root = worker_pb2.KvEventBatch(
        worker_id="w1",
        model="m",
        events=[worker_pb2.KvEvent(kind=worker_pb2.KvEvent.STORED, tier=cachemgr_pb2.CACHE_TIER_L1)],
    )
    assert kv_batch(root).events[0].parent_hash is None
    unknown = worker_pb2.KvEventBatch(worker_id="w1", model="m")
    unknown.events.add(kind=worker_pb2.KvEvent.STORED)  # tier unset: not a tier
    with pytest.raises(InvalidRequest):
        kv_batch(unknown)


def test_random_event_streams_keep_the_index_consistent_with_a_plain_model() -> None:
    """Seeded random batches (stores, removes, clears, lost batches) on three workers: an uncapped
    index holds exactly what a plain set model of the events says; a capped one a subset of it."""
    rng = random.Random(5)
    chains = [chain_hashes(list(range(i, i + 6 * BLOCK_TOKENS))) for i in range(4)]
    keys = [(tenant, h) for chain in chains for h in chain for tenant in ("t", "u")]
    full, capped = ClusterIndex(), ClusterIndex(max_entries=40)
    model: dict[tuple[str, KvTier], set[tuple[str, int]]] = {}
    stale: set[str] = set()
    sequence = {w: 1 for w in ("w1", "w2", "w3")}
    for worker in sequence:
        for index in (full, capped):
            index.apply(batch(worker, 1, cleared(L1), cleared(L2), cleared(L3)), 0.0)
    for step in range(1, 400):
        worker = rng.choice(list(sequence))
        lost = rng.random() < 0.05
        sequence[worker] += 2 if lost else 1
        events = []
        for _ in range(rng.randint(1, 3)):
            tier, tenant = rng.choice([L1, L2, L3]), rng.choice(["t", "u"])
            chain = rng.choice(chains)[: rng.randint(1, 6)]
            roll = rng.random()
            if roll < 0.6:
                events.append(stored(chain, tier, tenant, workflow_id=f"wf{rng.randint(0, 3)}"))
            elif roll < 0.9:
                events.append(removed(chain, tier, tenant))
            else:
                events.append(cleared(tier))
        if lost:
            stale.add(worker)
            for tier in (L1, L2, L3):
                model.pop((worker, tier), None)
        for event in events:
            held = model.setdefault((worker, event.tier), set())
            if event.kind is KvEventKind.CLEARED:
                held.clear()
                stale.discard(worker)
            elif worker in stale:
                continue
            elif event.kind is KvEventKind.STORED:
                held |= {(event.tenant, h) for h in event.block_hashes}
            else:
                held -= {(event.tenant, h) for h in event.block_hashes}
        for index in (full, capped):
            applied = index.apply(batch(worker, sequence[worker], *events), float(step))
            assert (applied.gap, applied.stale) == (lost, worker in stale)
            index.expire(float(step))
            index.check_integrity()
        for (w, tier), held in model.items():
            assert {k for k in keys if full.kv.holds(w, tier, *k)} == held
            assert {k for k in keys if capped.kv.holds(w, tier, *k)} <= held
        assert full.entries == sum(len(held) for held in model.values())
        assert capped.entries <= 40
        assert full.kv.distinct_blocks == len(set().union(*model.values()))
    assert (full.refused, capped.refused > 0) == (0, True)
