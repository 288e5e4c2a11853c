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
# KV tiers (L2 host, L3 shared); the engine's counters are monotonic, the gauges follow them
L2_USED = Gauge("cv_worker_l2_blocks_used", "KV blocks in use in the host pool (L2)")
L2_TOTAL = Gauge("cv_worker_l2_blocks_total", "KV blocks in the host pool (L2)")
HIT_TOKENS = Gauge("cv_worker_kv_hit_tokens_total", "Prompt tokens served from each KV tier", ["tier"])
_HITS_BY_TIER = tuple(HIT_TOKENS.labels(tier) for tier in ("L1", "L2", "L3"))
DEMOTED = Gauge("cv_worker_kv_demoted_blocks_total", "KV blocks copied down from L1 to L2 on eviction")
PROMOTED = Gauge("cv_worker_kv_promoted_blocks_total", "KV blocks loaded up from L2 into L1")
L3_WRITTEN = Gauge("cv_worker_l3_written_blocks_total", "KV blocks written to the L3 store")
L3_FETCHED = Gauge("cv_worker_l3_fetched_blocks_total", "KV blocks fetched from the L3 store")
L3_ERRORS = Gauge("cv_worker_l3_errors_total", "L3 store calls that failed")
KV_EVENTS_DROPPED = Counter(
    "cv_worker_kv_events_dropped_total", "KV event batches dropped because the publish queue was full"
)
KV_EVENTS_UNTRANSLATABLE = Counter(
    "cv_worker_kv_events_untranslatable_total",
    "Blocks a peer engine reported that could not be re-hashed (their parent's event was lost)",
)
ENGINE_UP = Gauge("cv_worker_engine_up", "1 while the peer engine (vllm, sglang) answers its metrics; 0 while it does not")
DIRECTIVES = Counter("cv_worker_directives_total", "Cache directive batches by outcome", ["source", "outcome"])
DIRECTIVE_MESSAGES_INVALID = Counter(
    "cv_worker_directive_messages_invalid_total", "Directive messages on NATS that could not be decoded"
)

# Constrained decoding (core/grammar.py): compiles by constraint kind and outcome (ok, invalid)
GRAMMAR_COMPILES = Counter(
    "cv_worker_grammar_compiles_total", "Output constraints compiled into grammars", ["kind", "outcome"]
)
GRAMMAR_CACHE_HITS = Counter("cv_worker_grammar_cache_hits_total", "Output constraints served from the grammar cache")
GRAMMAR_COMPILE_SECONDS = Histogram(
    "cv_worker_grammar_compile_seconds", "Time to compile one output constraint",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
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
    L2_USED.set(stats.l2_blocks_used)
    L2_TOTAL.set(stats.l2_blocks_total)
    for child, tokens in zip(_HITS_BY_TIER, stats.hit_tokens, strict=True):
        child.set(tokens)
    DEMOTED.set(stats.demoted_blocks_total)
    PROMOTED.set(stats.promoted_blocks_total)
    L3_WRITTEN.set(stats.l3_written_blocks_total)
    L3_FETCHED.set(stats.l3_fetched_blocks_total)
    L3_ERRORS.set(stats.l3_errors_total)
