"""Prometheus metrics of the scheduler (``cv_scheduler_*``).  The core returns facts; these count them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from clairvoyant.core.metrics import LATENCY_BUCKETS

# status: placed | queue_full | no_workers | invalid | cancelled | failed (lost before placement)
REQUESTS = Counter("cv_scheduler_requests_total", "Schedule calls by model and outcome", ["model", "status"])
QUEUE_DEPTH = Gauge("cv_scheduler_queue_depth", "Requests waiting in the global queue", ["model"])
QUEUE_WAIT = Histogram(
    "cv_scheduler_queue_wait_seconds",
    "Submit to placement in the global queue",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
# The model a model group's call was placed on (CV_MODEL_GROUPS; a model-choosing preset chose it).
GROUP_PLACEMENTS = Counter(
    "cv_scheduler_group_placements_total",
    "Calls of a model group placed, by the served model chosen for them",
    ["group", "model"],
)
WORKERS = Gauge("cv_scheduler_workers", "Live workers known from heartbeats", ["model"])
PLACEMENTS_FAILED = Counter(
    "cv_scheduler_placements_failed_total",
    "Placements lost because their worker stopped heartbeating",
    ["model"],
)
# reason: lease_expired (its owner stopped renewing) | unknown_to_worker (its worker never had it)
PLACEMENTS_RECLAIMED = Counter(
    "cv_scheduler_placements_reclaimed_total",
    "Placements released by the scheduler because nobody else did",
    ["model", "reason"],
)
# outcome: answered (alive; its heartbeats were lost) | silent (expired)
WORKER_PROBES = Counter(
    "cv_scheduler_worker_probes_total",
    "Stats calls to workers whose heartbeats stopped, before expiring them",
    ["outcome"],
)
# reason: undecodable | invalid (no worker or model, an unknown kind or tier)
KV_EVENTS_DROPPED = Counter(
    "cv_scheduler_kv_event_batches_dropped_total", "KV event batches dropped as malformed", ["reason"]
)
KV_EVENT_GAPS = Counter(
    "cv_scheduler_kv_event_gaps_total",
    "Sequence gaps in a worker's KV events (its index is dropped until its next CLEARED)",
)
# A label for rejected requests whose model no worker serves: client-chosen names must not grow
# the label set without bound.
UNKNOWN_MODEL = "_unknown"
