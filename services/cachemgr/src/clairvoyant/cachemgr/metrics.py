"""Prometheus metrics of the cache manager (``cv_cachemgr_*``).  The core returns facts and
counts; these publish them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from clairvoyant.cachemgr.core import CoreStats

DIRECTIVES = Counter("cv_cachemgr_directives_total", "Directives issued, by kind", ["kind"])
DIRECTIVES_UNSUPPORTED = Counter(
    "cv_cachemgr_directives_unsupported_total",
    "Directives not sent because their worker's engine cannot apply them, by kind",
    ["kind"],
)
# outcome: applied | refused (the worker checked the batch and applied none of it) | unanswered
# (no worker listening, or no answer within CV_CACHEMGR_DIRECTIVE_TIMEOUT_S) | unsent (NATS down)
DIRECTIVE_BATCHES = Counter(
    "cv_cachemgr_directive_batches_total", "Batches of directives sent to one worker, by outcome", ["outcome"]
)
# source: completions | kv_events | worker_stats
MALFORMED = Counter(
    "cv_cachemgr_malformed_total", "Messages that could not be decoded, dropped, by source", ["source"]
)
COMPLETIONS = Counter("cv_cachemgr_completions_total", "Completion records handed to the cache policy")
WORKERS_GONE = Counter(
    "cv_cachemgr_workers_gone_total", "Workers forgotten after three heartbeat intervals of silence"
)
INDEXED_BLOCKS = Gauge("cv_cachemgr_indexed_blocks", "Distinct (tenant, block hash) entries in the index")
LIVE_WORKFLOWS = Gauge("cv_cachemgr_live_workflows", "Workflows whose history is held")
HISTORY_BYTES = Gauge("cv_cachemgr_history_bytes", "Token ids held as workflow history, in bytes")
WORKERS = Gauge("cv_cachemgr_workers", "Workers the index has heard from")
# outcome: issued (named by promote and pre-prefill directives acting on a prediction) | used (by a
# later call of the tenant) | wasted (unused when the speculation closed); since start-up
SPECULATIVE_TOKENS = Gauge(
    "cv_cachemgr_speculative_tokens",
    "Tokens of speculative directives since start-up, by outcome",
    ["outcome"],
)
CONSUMER_CONNECTED = Gauge(
    "cv_cachemgr_consumer_connected", "1 while the JetStream consumer of cv.requests.completed is bound"
)


def observe(stats: CoreStats) -> None:
    """Set the gauges from the core's counts."""
    INDEXED_BLOCKS.set(stats.indexed_blocks)
    LIVE_WORKFLOWS.set(stats.live_workflows)
    HISTORY_BYTES.set(stats.history_bytes)
    WORKERS.set(stats.workers)
    SPECULATIVE_TOKENS.labels("issued").set(stats.speculative_tokens)
    SPECULATIVE_TOKENS.labels("used").set(stats.speculative_used_tokens)
    SPECULATIVE_TOKENS.labels("wasted").set(stats.speculative_wasted_tokens)
