"""The cache manager's wire conversions: records and heartbeats in, directives and stats out."""

from __future__ import annotations

import pytest

from clairvoyant.cachemgr import convert
from clairvoyant.cachemgr.core import CoreStats, TierCount
from clairvoyant.cachemgr.dispatch import by_worker, directives_subject
from clairvoyant.cachemgr.subscriptions import Liveness
from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2
from clairvoyant.core.annotations import Confidence
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.policy.cache import CacheDirective

pytestmark = pytest.mark.unit


def test_a_record_becomes_a_completed_call() -> None:
    msg = common_pb2.CompletionRecord(
        request_id="r1", tenant="acme", model="m", worker_id="w1", prompt_tokens=40, output_tokens=3,
        cached_tokens=16, status=common_pb2.REQUEST_STATUS_CANCELLED,
        timing=common_pb2.Timing(arrival_time=100.0, end_time=103.5),
        app_metadata=common_pb2.AppMetadata(workflow_id="wf", agent_id="a", tool="search"),
        prompt_block_hashes=[1, 2], response_block_hashes=[3], prompt_token_ids=[5, 6], output_token_ids=[7],
        annotations=common_pb2.SysAnnotations(confidence=common_pb2.CONFIDENCE_LOW, expected_remaining_steps=2.0),
    )  # fmt: skip
    call = convert.completed_call(msg)
    assert (call.start, call.end, call.ok) == (100.0, 103.5, False)
    assert (call.prompt_tokens, call.output_tokens, call.cached_tokens) == (40, 3, 16)
    assert call.app_metadata is not None and (call.app_metadata.workflow_id, call.app_metadata.tool) == (
        "wf",
        "search",
    )
    assert call.annotations is not None
    assert (call.annotations.confidence, call.annotations.expected_remaining_steps) == (Confidence.LOW, 2.0)
    assert (call.prompt_block_hashes, call.response_block_hashes) == ((1, 2), (3,))
    assert (call.prompt_token_ids, call.output_token_ids) == ((5, 6), (7,))


def test_a_bare_record_has_no_metadata_and_no_duration() -> None:
    msg = common_pb2.CompletionRecord(request_id="r1", timing=common_pb2.Timing(arrival_time=50.0))
    call = convert.completed_call(msg)
    assert (call.start, call.end, call.app_metadata, call.annotations, call.worker_id) == (
        50.0,
        50.0,
        None,
        None,
        "",
    )


def test_a_heartbeat_becomes_a_worker_load() -> None:
    stats = worker_pb2.WorkerStats(
        worker_id="w1", model="m", running=2, queued=1, max_batch=8, kv_blocks_used=9, kv_blocks_total=99,
        tiers=[
            worker_pb2.TierUsage(tier=cachemgr_pb2.CACHE_TIER_L1, blocks_used=5, blocks_total=64, hit_tokens=32),
            worker_pb2.TierUsage(tier=cachemgr_pb2.CACHE_TIER_L3, hit_tokens=8),
        ],
    )  # fmt: skip
    load = convert.worker_load(stats)
    assert (load.running, load.queued, load.max_batch) == (2, 1, 8)
    assert (load.l1_used, load.l1_total, load.l2_used, load.l2_total) == (5, 64, 0, 0)
    assert (load.has_l3, load.hit_tokens) == (True, (32, 0, 8))
    # A worker that reports no tiers: L1 from its pool counts, no L3.
    bare = convert.worker_load(
        worker_pb2.WorkerStats(worker_id="w2", model="m", kv_blocks_used=9, kv_blocks_total=99)
    )
    assert (bare.l1_used, bare.l1_total, bare.has_l3, bare.hit_tokens) == (9, 99, False, (0, 0, 0))
    with pytest.raises(InvalidRequest):
        convert.worker_load(worker_pb2.WorkerStats(model="m"))


def test_directives_go_out_in_the_workers_vocabulary() -> None:
    retain = CacheDirective("retain", "w1", "acme", workflow_id="wf", agent_id="a", request_id="r",
                            block_hashes=(7, (1 << 64) - 1), ttl_s=12.5, target_tier=2)  # fmt: skip
    msg = convert.directive(retain)
    assert msg.kind == cachemgr_pb2.DIRECTIVE_KIND_RETAIN
    assert (msg.lineage.tenant, msg.lineage.workflow_id, msg.lineage.agent_id, msg.lineage.request_id) == (
        "acme", "wf", "a", "r",
    )  # fmt: skip
    assert list(msg.block_hashes) == ["7", "18446744073709551615"]
    assert (msg.ttl_s, msg.target_tier, msg.worker_id) == (12.5, cachemgr_pb2.CACHE_TIER_L2, "w1")
    drop = convert.directive(CacheDirective("drop", "w1", "acme", workflow_id="wf"))
    assert (drop.kind, drop.HasField("ttl_s"), drop.target_tier) == (
        cachemgr_pb2.DIRECTIVE_KIND_DROP, False, cachemgr_pb2.CACHE_TIER_UNSPECIFIED,
    )  # fmt: skip
    kinds = [convert.directive(CacheDirective(k, "w", "t")).kind for k in convert.KINDS]
    assert kinds == [1, 2, 3, 4, 5]


def test_stats_carry_every_count() -> None:
    stats = CoreStats(
        policy="lru", indexed_blocks=4, directives_issued=3, completions_seen=2, events_seen=9, malformed_dropped=1,
        live_workflows=5, history_bytes=640, workers=2,
        tiers=(TierCount(1, 5, 64, 32, 8), TierCount(2, 2, 256, 16, 0), TierCount(3, 7, 0, 0, 0)),
    )  # fmt: skip
    msg = convert.cache_stats(stats)
    assert (msg.policy, msg.indexed_blocks, msg.directives_issued, msg.completions_seen) == ("lru", 4, 3, 2)
    assert (msg.events_seen, msg.malformed_dropped, msg.live_workflows, msg.history_bytes, msg.workers) == (
        9, 1, 5, 640, 2,
    )  # fmt: skip
    assert [(t.tier, t.blocks_used, t.blocks_total, t.hits, t.misses) for t in msg.tiers] == [
        (cachemgr_pb2.CACHE_TIER_L1, 5, 64, 32, 8),
        (cachemgr_pb2.CACHE_TIER_L2, 2, 256, 16, 0),
        (cachemgr_pb2.CACHE_TIER_L3, 7, 0, 0, 0),
    ]


def test_batches_are_grouped_per_worker_in_issue_order() -> None:
    items = [
        CacheDirective("drop", w, "t", request_id=str(i)) for i, w in enumerate(["w2", "w1", "w2", "w3"])
    ]
    groups = by_worker(items)
    assert list(groups) == ["w2", "w1", "w3"]
    assert [d.request_id for d in groups["w2"]] == ["0", "2"]
    assert directives_subject("node1.example.com:50061") == "cv.cache.directives.node1_example_com:50061"


def test_a_worker_is_gone_after_three_silent_heartbeat_intervals() -> None:
    liveness = Liveness()
    liveness.heard("w1", 0.5, now=10.0)
    liveness.heard("w2", 0.0, now=10.0)  # states no interval: the workers' default, 1 s
    assert liveness.sweep(11.5) == []
    assert liveness.sweep(11.6) == ["w1"]
    assert liveness.sweep(13.0) == []
    assert liveness.sweep(13.1) == ["w2"]
    assert liveness.sweep(100.0) == []  # forgotten once
