"""The mark the overhead breakdown cuts at: the ``last_message`` event of ``gateway.generate``,
set when the answer is whole (the release and the record come later, off the request's path)."""

from __future__ import annotations

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from clairvoyant.bench.gateway_breakdown import STAGES, Span, stages
from tests.gateway.conftest import StackFactory
from tests.gateway.fakes import MODEL
from tests.gateway.test_operations import spans  # noqa: F401 - the fixture

CHAT = [{"role": "user", "content": "hello there"}]


async def test_the_answer_is_marked_before_the_request_span_ends(
    make_stack: StackFactory,
    spans: InMemorySpanExporter,  # noqa: F811 - the fixture imported above
) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.url) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    assert reply.status_code == 200
    await stack.server.frontend.pipeline.aclose()  # the release and the record finish after the reply
    request_id = reply.headers["x-request-id"]
    [request_span] = [
        s for s in spans.get_finished_spans()
        if s.name == "gateway.request" and s.attributes["cv.request_id"] == request_id
    ]  # fmt: skip
    [generate_span] = [
        s for s in spans.get_finished_spans()
        if s.name == "gateway.generate" and s.context.trace_id == request_span.context.trace_id
    ]  # fmt: skip
    events = {event.name: event.timestamp for event in generate_span.events}
    assert generate_span.start_time <= events["first_token"] <= events["last_message"]
    assert events["last_message"] <= generate_span.end_time <= request_span.end_time


def test_stages_cut_at_the_last_message_and_add_up() -> None:
    ms = 1_000_000
    spans_of_one_request = [
        Span("gateway.request", 2 * ms, 30 * ms, "r", {}),  # ends after the answer: release, record
        Span("gateway.schedule", 3 * ms, 5 * ms, "r", {}),
        Span("gateway.generate", 5 * ms, 29 * ms, "r", {"first_token": 9 * ms, "last_message": 14 * ms}),
        Span("worker.generate", 6 * ms, 13 * ms, "", {}),
    ]
    row = stages(spans_of_one_request, sent=1 * ms, received=16 * ms)
    assert row == [1.0, 1.0, 2.0, 1.0, 7.0, 1.0, 2.0]
    assert len(row) == len(STAGES) and sum(row) == 15.0  # the client-observed total
    no_answer = [s for s in spans_of_one_request if s.name != "gateway.generate"]
    assert stages(no_answer, sent=1 * ms, received=16 * ms) is None
