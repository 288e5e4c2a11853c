"""OpenTelemetry tracing and context propagation.

Export goes to ``OTEL_EXPORTER_OTLP_ENDPOINT`` when set and is off otherwise.  Trace context
travels in gRPC metadata and in NATS message headers (W3C ``traceparent``), so one trace spans
gateway -> scheduler (queue wait) -> worker (prefill, decode).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

logger = logging.getLogger(__name__)


def setup_tracing(service: str, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install a tracer provider for ``service``; pass ``exporter`` to capture spans in tests."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"clairvoyant-{service}"}))
    if exporter is None and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
        logger.info("exporting traces to %s", os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"])
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers() -> dict[str, str]:
    """The current trace context as headers (for NATS messages)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def grpc_metadata() -> list[tuple[str, str]]:
    """The current trace context as gRPC call metadata."""
    return list(inject_headers().items())


def extract_context(carrier: Mapping[str, str] | Iterable[tuple[str, str | bytes]] | None) -> otel_context.Context:
    """A context from NATS headers or gRPC invocation metadata."""
    if carrier is None:
        return otel_context.get_current()
    items = carrier.items() if isinstance(carrier, Mapping) else carrier
    text = {k.lower(): v for k, v in items if isinstance(v, str)}
    return propagate.extract(text)
