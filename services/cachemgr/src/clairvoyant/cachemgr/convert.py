"""Wire <-> core for the cache manager: completion records and worker stats in, directives and
stats out.  KV event batches are decoded by ``clairvoyant.core.wire.kv_batch``."""

from __future__ import annotations

from clairvoyant.cachemgr.core import CoreStats
from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.wire import annotations_from_proto, app_metadata_from_proto
from clairvoyant.policy.cache import CacheDirective, CompletedCall, DirectiveKind, Tier, WorkerLoad

KINDS: dict[DirectiveKind, cachemgr_pb2.DirectiveKind] = {
    "drop": cachemgr_pb2.DIRECTIVE_KIND_DROP,
    "retain": cachemgr_pb2.DIRECTIVE_KIND_RETAIN,
    "write_back": cachemgr_pb2.DIRECTIVE_KIND_WRITE_BACK,
    "promote": cachemgr_pb2.DIRECTIVE_KIND_PROMOTE,
    "pre_prefill": cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL,
}
TIERS: dict[Tier | None, cachemgr_pb2.CacheTier] = {
    None: cachemgr_pb2.CACHE_TIER_UNSPECIFIED,
    1: cachemgr_pb2.CACHE_TIER_L1,
    2: cachemgr_pb2.CACHE_TIER_L2,
    3: cachemgr_pb2.CACHE_TIER_L3,
}


def completed_call(msg: common_pb2.CompletionRecord) -> CompletedCall:
    """The call a record describes (``core.call_problem`` says whether it keeps its contract).
    Times are the gateway's wall clock: the call starts when the request arrived and ends when its
    last byte was sent (no end time: instantaneous).  A request that failed before its placement
    has no worker: the policy sees ``worker_id`` "" (it directs nobody for it)."""
    start = msg.timing.arrival_time
    end = max(msg.timing.end_time, start)
    return CompletedCall(
        request_id=msg.request_id,
        tenant=msg.tenant,
        model=msg.model,
        worker_id=msg.worker_id,
        start=start,
        end=end,
        prompt_tokens=msg.prompt_tokens,
        output_tokens=msg.output_tokens,
        cached_tokens=msg.cached_tokens,
        ok=msg.status == common_pb2.REQUEST_STATUS_OK,
        app_metadata=app_metadata_from_proto(msg.app_metadata) if msg.HasField("app_metadata") else None,
        annotations=annotations_from_proto(msg.annotations) if msg.HasField("annotations") else None,
        prompt_block_hashes=tuple(msg.prompt_block_hashes),
        response_block_hashes=tuple(msg.response_block_hashes),
        prompt_token_ids=tuple(msg.prompt_token_ids),
        output_token_ids=tuple(msg.output_token_ids),
    )


def worker_load(stats: worker_pb2.WorkerStats) -> WorkerLoad:
    """A heartbeat as the cache manager keeps it.  L1 is the worker's device pool (its tier usage
    when it reports one, else ``kv_blocks_*``).  Raises InvalidRequest without a worker id or model."""
    if not stats.worker_id or not stats.model:
        raise InvalidRequest("worker stats need worker_id and model")
    tiers = {usage.tier: usage for usage in stats.tiers}
    l1, l2 = tiers.get(cachemgr_pb2.CACHE_TIER_L1), tiers.get(cachemgr_pb2.CACHE_TIER_L2)
    hits = tuple(
        tiers[tier].hit_tokens if tier in tiers else 0
        for tier in (cachemgr_pb2.CACHE_TIER_L1, cachemgr_pb2.CACHE_TIER_L2, cachemgr_pb2.CACHE_TIER_L3)
    )
    return WorkerLoad(
        worker_id=stats.worker_id,
        model=stats.model,
        running=stats.running,
        queued=stats.queued,
        max_batch=stats.max_batch,
        l1_used=l1.blocks_used if l1 is not None else stats.kv_blocks_used,
        l1_total=l1.blocks_total if l1 is not None else stats.kv_blocks_total,
        l2_used=l2.blocks_used if l2 is not None else 0,
        l2_total=l2.blocks_total if l2 is not None else 0,
        has_l3=cachemgr_pb2.CACHE_TIER_L3 in tiers,
        hit_tokens=(hits[0], hits[1], hits[2]),
    )


def directive(item: CacheDirective) -> cachemgr_pb2.CacheDirective:
    """The worker's wire form: block hashes as decimal strings, the lineage as a selector."""
    msg = cachemgr_pb2.CacheDirective(
        kind=KINDS[item.kind],
        lineage=cachemgr_pb2.LineageSelector(
            tenant=item.tenant,
            workflow_id=item.workflow_id,
            agent_id=item.agent_id,
            request_id=item.request_id,
        ),
        block_hashes=[str(block_hash) for block_hash in item.block_hashes],
        target_tier=TIERS[item.target_tier],
        token_ids=item.token_ids,
        worker_id=item.worker_id,
    )
    if item.ttl_s is not None:
        msg.ttl_s = item.ttl_s
    return msg


def cache_stats(stats: CoreStats) -> cachemgr_pb2.CacheStats:
    return cachemgr_pb2.CacheStats(
        tiers=[
            cachemgr_pb2.TierStats(
                tier=TIERS[count.tier],
                blocks_used=count.blocks_used,
                blocks_total=count.blocks_total,
                hits=count.hits,
                misses=count.misses,
            )
            for count in stats.tiers
        ],
        indexed_blocks=stats.indexed_blocks,
        policy=stats.policy,
        directives_issued=stats.directives_issued,
        completions_seen=stats.completions_seen,
        events_seen=stats.events_seen,
        malformed_dropped=stats.malformed_dropped,
        live_workflows=stats.live_workflows,
        history_bytes=stats.history_bytes,
        workers=stats.workers,
    )
