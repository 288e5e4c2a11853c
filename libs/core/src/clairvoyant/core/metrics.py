"""Prometheus metrics shared by the services (all named ``cv_*``)."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

logger = logging.getLogger(__name__)

# Seconds; spans a CPU tiny model (ms) to long agent calls (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def serve_metrics(host: str, port: int) -> None:
    """Expose /metrics for a service without an HTTP server of its own.  Port 0 disables it."""
    if port:
        start_http_server(port, addr=host)
        logger.info("metrics on http://%s:%d/metrics", host, port)
