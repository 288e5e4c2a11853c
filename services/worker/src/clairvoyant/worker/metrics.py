"""Prometheus metrics of the worker (``cv_worker_*``).  The engine returns stats; these show them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from clairvoyant.core.metrics import LATENCY_BUCKETS
from clairvoyant.worker.core.engine import EngineStats

REQUESTS = Counter("cv_worker_requests_total", "Requests finished by the worker", ["status"])
TTFT = Histogram("cv_worker_ttft_seconds", "Arrival to first token on the worker", buckets=LATENCY_BUCKETS)
E2E = Histogram("cv_worker_e2e_seconds", "Arrival to last token on the worker", buckets=LATENCY_BUCKETS)
RUNNING = Gauge("cv_worker_running", "Sequences running in the batch")
QUEUED = Gauge("cv_worker_queued", "Sequences waiting in the local queue")
KV_USED = Gauge("cv_worker_kv_blocks_used", "KV blocks in use (L1)")
KV_TOTAL = Gauge("cv_worker_kv_blocks_total", "KV blocks in the pool (L1)")
KV_CACHED = Gauge("cv_worker_kv_blocks_cached", "KV blocks held only by the prefix cache")
PREEMPTIONS = Gauge("cv_worker_preemptions_total", "Sequences preempted (recompute) since start")
GENERATED = Gauge("cv_worker_generated_tokens_total", "Output tokens generated since start")
CACHED_PROMPT = Gauge("cv_worker_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache")
KV_MIGRATED = Counter(
    "cv_worker_kv_migrated_tokens_total", "Prefix tokens sent or cached by KV migration", ["direction"]
)


def record_stats(stats: EngineStats) -> None:
    """The engine loop's ``on_step``: the gauges follow the engine after every step."""
    RUNNING.set(stats.running)
    QUEUED.set(stats.waiting)
    KV_USED.set(stats.kv_blocks_used)
    KV_TOTAL.set(stats.kv_blocks_total)
    KV_CACHED.set(stats.kv_blocks_cached)
    PREEMPTIONS.set(stats.preemptions_total)
    GENERATED.set(stats.generated_tokens_total)
    CACHED_PROMPT.set(stats.cached_prompt_tokens_total)
