"""Prometheus metrics of the profiler (``cv_profiler_*``).  The core returns facts; these count them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from clairvoyant.core.metrics import LATENCY_BUCKETS

# outcome: accepted | duplicate | late | stale (the core's IngestStatus), no_workflow (no
# app_metadata workflow ids: nothing to learn), undecodable
RECORDS = Counter("cv_profiler_records_total", "Completion records consumed, by outcome", ["outcome"])
INSTANCES_CLOSED = Counter(
    "cv_profiler_instances_closed_total", "Workflow instances closed and learned from", ["reason"]
)  # reason: end (the workflow_end marker) | idle (idle_timeout_s without a call)
PROFILES = Gauge("cv_profiler_profiles", "(tenant, workflow type) profiles in memory")
ANNOTATIONS = Counter("cv_profiler_annotations_total", "Annotate answers by confidence tier", ["confidence"])
ANNOTATE_SECONDS = Histogram(
    "cv_profiler_annotate_seconds", "Time to answer one Annotate call", buckets=LATENCY_BUCKETS
)
PERSIST_SECONDS = Histogram(
    "cv_profiler_persist_seconds", "One batch's log entries appended in one transaction", buckets=LATENCY_BUCKETS
)
PERSIST_FAILURES = Counter(
    "cv_profiler_persist_failures_total", "Batches whose log append failed (left unacked, redelivered later)"
)
SNAPSHOT_SECONDS = Histogram(
    "cv_profiler_snapshot_seconds", "Profile snapshots written (and the log pruned) in one transaction",
    buckets=LATENCY_BUCKETS,
)
SNAPSHOT_FAILURES = Counter(
    "cv_profiler_snapshot_failures_total", "Snapshot writes that failed (the log still holds the changes)"
)
UNSNAPSHOTTED = Gauge(
    "cv_profiler_unsnapshotted_entries", "Log entries no snapshot covers yet: what a restart would replay"
)
CONSUMER_CONNECTED = Gauge(
    "cv_profiler_consumer_connected", "1 while the JetStream consumer of cv.requests.completed is bound"
)
