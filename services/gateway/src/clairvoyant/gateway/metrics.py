"""Prometheus metrics of the gateway (``cv_gateway_*``) and the ASGI middleware that counts requests."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clairvoyant.core.metrics import LATENCY_BUCKETS

REQUESTS = Counter(
    "cv_gateway_requests_total",
    "Requests answered, by endpoint and status (HTTP code or gRPC code)",
    ["endpoint", "status"],
)
TTFT = Histogram(
    "cv_gateway_ttft_seconds", "From arrival to the first output token", ["endpoint"], buckets=LATENCY_BUCKETS
)
E2E_LATENCY = Histogram(
    "cv_gateway_e2e_latency_seconds",
    "From arrival to the end of a completed request",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
IN_FLIGHT = Gauge("cv_gateway_in_flight_requests", "Requests admitted to the pipeline and not yet finished")
OUTPUT_TOKENS = Counter("cv_gateway_output_tokens_total", "Output tokens streamed to clients", ["model"])
RECORDS = Counter(
    "cv_gateway_completion_records_total",
    "CompletionRecords, by status and whether JetStream acked at once",
    ["status", "delivery"],
)
RETRIES = Counter("cv_gateway_worker_retries_total", "Requests re-placed after a worker was unavailable")
UNANNOTATED = Counter(
    "cv_gateway_unannotated_requests_total",
    "Requests scheduled without the profiler's annotations, by reason",
    ["reason"],
)
# Why a request went un-annotated: the profiler missed the deadline on a connected channel; failed
# the call; could not be reached (refused, or the deadline went on connecting); no profiler is
# configured; the request has no app_metadata to look up.
UNANNOTATED_REASONS = ("timeout", "error", "unavailable", "no_profiler", "no_metadata")
for _reason in UNANNOTATED_REASONS:  # export every series from the start, at 0
    UNANNOTATED.labels(_reason)

BUSY_REFUSALS = Counter(
    "cv_gateway_busy_refusals_total",
    "Requests refused 429 because the system or the caller is busy, by reason",
    ["reason"],
)
# The scheduler said the model's queue is full; the gateway answered so itself, within the short
# hold after the scheduler said it; the scheduler shed the call (gRPC's pending-call limit); the
# key ran out of its requests or tokens per minute.
BUSY_REASONS = ("queue_full", "queue_full_held", "scheduler_shed", "rate_limit_requests", "rate_limit_tokens")
for _reason in BUSY_REASONS:
    BUSY_REFUSALS.labels(_reason)

RELEASE_FAILURES = Counter(
    "cv_gateway_release_failures_total",
    "Scheduler.Complete calls (placement releases) that failed, by what followed",
    ["outcome"],
)
# Tried again after a back-off; left to the scheduler's placement lease (attempts spent, or too
# many releases already waiting to be retried).
RELEASE_OUTCOMES = ("retried", "abandoned")
for _outcome in RELEASE_OUTCOMES:
    RELEASE_FAILURES.labels(_outcome)

# The request paths worth a label; everything else (health, metrics, 404s) is "other".
HTTP_ENDPOINTS = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/v1/models": "models",
}


class RequestCounter:
    """Counts every HTTP answer by endpoint and status code, streaming ones included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = HTTP_ENDPOINTS.get(scope["path"].rstrip("/"), "other")
        status = "500"  # stays so when the app fails before starting a response

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            REQUESTS.labels(endpoint, status).inc()
