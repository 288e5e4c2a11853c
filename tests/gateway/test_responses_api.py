"""OpenAI's Responses API (POST/GET/DELETE /v1/responses), driven with the official openai SDK and
httpx against the fake scheduler and worker: text, function calls, structured output, stored
chains, tenants, sessions, every refusal, and a store that is down."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import agents
import httpx
import openai
import pytest
from agents.models.openai_responses import OpenAIResponsesModel
from sqlalchemy import create_engine, text

from clairvoyant.contracts.v1 import common_pb2, worker_pb2
from clairvoyant.gateway.keys import KeyStore
from clairvoyant.gateway.responses_stream import StreamedOutput
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL, FakeWorker

SYSTEM = "You are the planner. Break the task into steps."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
ARGUMENT_PIECES = ('{"city"', ': "Par', 'is"}')


def sys_agent(system: str) -> str:
    return "sys-" + hashlib.sha256(system.encode()).hexdigest()[:12]


@dataclass
class ToolWorker(FakeWorker):
    """A worker that answers a request carrying tools with ``lead`` text, then ``call_count`` tool
    calls, each streamed as ToolCallDelta pieces (id and name first, then the arguments in
    ``ARGUMENT_PIECES``), and finish_reason "tool_calls"; without tools it answers as FakeWorker."""

    lead: str = ""
    call_count: int = 1
    finish_reason: str = "tool_calls"

    async def Generate(self, request, context) -> AsyncIterator[worker_pb2.GenerateResponse]:  # noqa: N802
        if not request.tools:
            async for reply in super().Generate(request, context):
                yield reply
            return
        self.calls.append(request)
        if self.lead:
            yield worker_pb2.GenerateResponse(request_id=request.request_id, text=self.lead, prompt_tokens=7)
        sent = 0
        for index in range(self.call_count):
            name = request.tools[index % len(request.tools)].name
            head = common_pb2.ToolCallDelta(index=index, id=f"call_{index}x", name=name)
            yield worker_pb2.GenerateResponse(
                request_id=request.request_id, tool_calls=[head], prompt_tokens=7
            )
            for piece in ARGUMENT_PIECES:
                sent += 1
                delta = common_pb2.ToolCallDelta(index=index, arguments=piece)
                yield worker_pb2.GenerateResponse(request_id=request.request_id, tool_calls=[delta])
        yield worker_pb2.GenerateResponse(
            request_id=request.request_id,
            finish_reason=self.finish_reason,
            usage=common_pb2.Usage(
                prompt_tokens=7, completion_tokens=sent, total_tokens=7 + sent, cached_tokens=3
            ),
        )


class CallDelta(NamedTuple):
    index: int
    id: str
    name: str
    arguments: str


def client(stack: Stack, api_key: str = "not-needed") -> openai.AsyncOpenAI:
    return stack.openai(api_key)


async def post(stack: Stack, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.url, timeout=10) as http:
        return await http.post("/v1/responses", json=body, headers=headers)


def refusal(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def chat_of(call: worker_pb2.GenerateRequest) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in call.chat.messages]


# ---- text -----------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_a_text_response_in_openai_shape(stack: Stack) -> None:
    started = int(time.time())
    reply = await client(stack).responses.create(
        model=MODEL, input="say hello to the world", instructions=SYSTEM, store=False, metadata={"k": "v"}
    )
    assert reply.object == "response" and reply.status == "completed" and reply.model == MODEL
    assert reply.id.startswith("resp_") and len(reply.id) == len("resp_") + 32
    assert reply.created_at >= started
    assert reply.output_text == "Hello, world!"
    [item] = reply.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert [(part.type, part.text) for part in item.content] == [("output_text", "Hello, world!")]
    assert (reply.instructions, reply.metadata, reply.store, reply.tools) == (SYSTEM, {"k": "v"}, False, [])
    # The fake counts a word a token and caches half the prompt; OpenAI's input_tokens include cached ones.
    prompt_tokens = len(f"{SYSTEM}\nsay hello to the world".split())
    usage = reply.usage
    assert usage is not None
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens) == (
        prompt_tokens,
        prompt_tokens // 2,
    )
    assert (usage.output_tokens, usage.output_tokens_details.reasoning_tokens) == (4, 0)
    assert usage.total_tokens == prompt_tokens + 4
    # Instructions are a system turn before the input.
    assert chat_of(stack.worker.calls[0]) == [("system", SYSTEM), ("user", "say hello to the world")]
    record = await stack.records.next()
    assert (record.endpoint, record.request_id, record.finish_reason) == ("responses", reply.id[5:], "stop")
    assert not record.HasField("app_metadata")  # stored nowhere, no session: untagged


@pytest.mark.integration
async def test_a_streamed_response_sends_the_events_the_sdk_assembles(stack: Stack) -> None:
    async with client(stack).responses.stream(model=MODEL, input="hi", store=False) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert deltas == ["Hello", ",", " world", "!"]
    assert final.output_text == "Hello, world!" and final.status == "completed"
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    assert final.usage is not None and final.usage.output_tokens == 4


@pytest.mark.integration
async def test_the_token_limit_makes_a_response_incomplete(stack: Stack) -> None:
    reply = await client(stack).responses.create(model=MODEL, input="hi", max_output_tokens=2, store=False)
    assert (reply.status, reply.incomplete_details and reply.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert reply.output_text == "Hello," and reply.output[0].status == "incomplete"
    assert reply.max_output_tokens == 2 and stack.worker.calls[0].sampling.max_tokens == 2

    response = await post(
        stack, {"model": MODEL, "input": "hi", "max_output_tokens": 2, "stream": True, "store": False}
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


# ---- the stream's items ------------------------------------------------------------------------


def kinds_and_items(chunks: list[bytes]) -> list[str]:
    return [json.loads(chunk.decode().split("data: ", 1)[1])["type"] for chunk in chunks]


@pytest.mark.unit
def test_whitespace_alone_opens_no_message() -> None:
    stream = StreamedOutput("r1")
    assert stream.text("\n") == [] and stream.text(" ") == []
    first = stream.call(CallDelta(0, "call_a", "f", '{"x": 1}'))
    assert kinds_and_items(first) == ["response.output_item.added", "response.function_call_arguments.delta"]
    assert stream.text("\n") == []  # between calls: held
    stream.call(CallDelta(1, "call_b", "g", "{}"))
    finish = stream.finish("tool_calls")
    assert kinds_and_items(finish) == ["response.function_call_arguments.done", "response.output_item.done"]
    assert [(item.type, item.id, item.status) for item in stream.items] == [
        ("function_call", "fc_r1_0", "completed"),
        ("function_call", "fc_r1_1", "completed"),
    ]


@pytest.mark.unit
def test_held_whitespace_joins_the_text_that_follows() -> None:
    stream = StreamedOutput("r2")
    stream.text("\n")
    opened = stream.text("Hi")
    assert kinds_and_items(opened) == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert json.loads(opened[-1].decode().split("data: ", 1)[1])["delta"] == "\nHi"
    stream.finish("stop")
    [message] = stream.items
    assert message.type == "message" and message.content[0].text == "\nHi"


@pytest.mark.unit
def test_an_answer_of_whitespace_is_still_a_message() -> None:
    stream = StreamedOutput("r3")
    assert stream.text("  ") == []
    events = stream.finish("length")
    kinds = kinds_and_items(events)
    assert kinds[:3] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    [message] = stream.items
    assert (message.content[0].text, message.status) == ("  ", "incomplete")
    numbers = [json.loads(e.decode().split("data: ", 1)[1])["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))


# ---- tools ----------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_function_calls_come_back_as_items(make_stack: StackFactory) -> None:
    worker = ToolWorker(lead="Let me look.", call_count=2)
    stack = await make_stack(workers=[worker])
    reply = await client(stack).responses.create(
        model=MODEL,
        input="weather in Paris and Lyon?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=True,
        store=False,
    )
    assert [item.type for item in reply.output] == ["message", "function_call", "function_call"]
    assert reply.output_text == "Let me look."
    calls = reply.output[1:]
    assert [(c.call_id, c.name, c.arguments, c.status) for c in calls] == [
        ("call_0x", "get_weather", '{"city": "Paris"}', "completed"),
        ("call_1x", "get_weather", '{"city": "Paris"}', "completed"),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("fc_") for c in calls)
    assert reply.tool_choice.type == "function" and reply.tool_choice.name == "get_weather"
    assert reply.tools[0].name == "get_weather" and reply.tools[0].strict is True
    # The worker got the flat tool as a Tool, and the forced choice.
    sent = worker.calls[0]
    assert [(t.name, t.description, t.strict) for t in sent.tools] == [
        ("get_weather", "The weather in a city", True)
    ]
    assert json.loads(sent.tools[0].parameters_json) == WEATHER_TOOL["parameters"]
    assert sent.tool_choice.function_name == "get_weather" and sent.parallel_tool_calls
    record = await stack.records.next()
    assert record.finish_reason == "tool_calls"


@pytest.mark.integration
async def test_a_call_cut_by_the_token_limit_is_incomplete(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[ToolWorker(lead="Checking.", finish_reason="length")])
    body = {"model": MODEL, "input": "weather?", "tools": [WEATHER_TOOL], "store": False}
    whole = (await post(stack, body)).json()
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [(item["type"], item["status"]) for item in whole["output"]] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    streamed = await post(stack, {**body, "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(item["type"], item["status"]) for item in done] == [
        ("message", "completed"),
        ("function_call", "incomplete"),
    ]
    assert events[-1]["type"] == "response.incomplete"
    # The stream and the whole answer agree, ids aside.
    final = events[-1]["response"]["output"]
    assert [{k: v for k, v in item.items() if k != "id"} for item in final] == [
        {k: v for k, v in item.items() if k != "id"} for item in whole["output"]
    ]


@pytest.mark.integration
async def test_streamed_function_call_arguments(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[ToolWorker()])
    async with client(stack).responses.stream(
        model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required", store=False
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.delta for e in events if e.type == "response.function_call_arguments.delta"] == list(
        ARGUMENT_PIECES
    )
    done = events[-3]
    assert (done.name, done.arguments) == ("get_weather", '{"city": "Paris"}')
    [call] = final.output
    assert (call.type, call.call_id, call.arguments) == ("function_call", "call_0x", '{"city": "Paris"}')
    # A strict tool's arguments come back parsed too (the SDK parses them against the tool).
    assert call.parsed_arguments == {"city": "Paris"}


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
@pytest.mark.integration
async def test_a_tool_choice_mode_reaches_the_worker(make_stack: StackFactory, choice: str) -> None:
    worker = ToolWorker()
    stack = await make_stack(workers=[worker])
    await client(stack).responses.create(
        model=MODEL, input="x", tools=[WEATHER_TOOL], tool_choice=choice, store=False
    )
    modes = {
        "auto": common_pb2.ToolChoice.AUTO,
        "none": common_pb2.ToolChoice.NONE,
        "required": common_pb2.ToolChoice.REQUIRED,
    }
    assert worker.calls[0].tool_choice.mode == modes[choice]


@pytest.mark.integration
async def test_a_function_call_output_round_trip(make_stack: StackFactory) -> None:
    worker = ToolWorker()
    stack = await make_stack(workers=[worker])
    sdk = client(stack)
    first = await sdk.responses.create(
        model=MODEL, input="weather in Paris?", tools=[WEATHER_TOOL], store=False
    )
    [call] = first.output
    assert call.type == "function_call"
    # The client runs the tool and sends the whole conversation back, call and output included.
    items: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"},
    ]
    second = await sdk.responses.create(model=MODEL, input=items, store=False)  # no tools: a plain answer
    assert second.output_text == "Hello, world!"
    sent = worker.calls[-1]
    assert [m.role for m in sent.chat.messages] == ["user", "assistant", "tool"]
    assistant, tool = sent.chat.messages[1], sent.chat.messages[2]
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("call_0x", "get_weather", '{"city": "Paris"}')
    ]
    assert (tool.content, tool.tool_call_id, tool.name) == ("18C and sunny", "call_0x", "get_weather")


@pytest.mark.integration
async def test_message_items_with_content_parts(stack: Stack) -> None:
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {
            "type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
            "content": [{"type": "output_text", "text": "earlier answer", "annotations": [], "logprobs": []}],
        },
        {"role": "user", "content": "and now?"},
    ]  # fmt: skip
    await client(stack).responses.create(model=MODEL, input=items, store=False)
    assert chat_of(stack.worker.calls[0]) == [
        ("system", "be brief"),
        ("user", "ab"),
        ("assistant", "earlier answer"),
        ("user", "and now?"),
    ]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.integration
async def test_an_agents_sdk_run_against_the_gateway(make_stack: StackFactory, streamed: bool) -> None:
    agents.set_tracing_disabled(True)
    stack = await make_stack(workers=[ToolWorker()])
    ran: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agent = agents.Agent(
        name="weather",
        instructions=SYSTEM,
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client(stack)),
        tool_use_behavior="stop_on_first_tool",
    )
    if streamed:
        run = agents.Runner.run_streamed(agent, "weather in Paris?", max_turns=2)
        kinds = [event.type async for event in run.stream_events()]
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
        final = run.final_output
    else:
        final = (await agents.Runner.run(agent, "weather in Paris?", max_turns=2)).final_output
    assert (ran, final) == (["Paris"], "sunny in Paris")
    sent = stack.worker.calls[0]
    assert [(m.role, m.content) for m in sent.chat.messages] == [
        ("system", SYSTEM),
        ("user", "weather in Paris?"),
    ]
    assert [t.name for t in sent.tools] == ["get_weather"] and sent.tools[0].strict
    record = await stack.records.next()
    assert record.app_metadata.agent_id == sys_agent(SYSTEM)


# ---- structured output ------------------------------------------------------------------------------


@pytest.mark.integration
async def test_text_format_becomes_the_output_constraint(stack: Stack) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    sdk = client(stack)
    reply = await sdk.responses.create(
        model=MODEL,
        input="answer in JSON",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        store=False,
    )
    constraint = stack.worker.calls[0].sampling.constraint
    assert constraint.WhichOneof("kind") == "json_schema" and json.loads(constraint.json_schema) == schema
    assert reply.text is not None and reply.text.format.type == "json_schema"
    await sdk.responses.create(
        model=MODEL, input="JSON", text={"format": {"type": "json_object"}}, store=False
    )
    assert stack.worker.calls[1].sampling.constraint.WhichOneof("kind") == "json_object"
    await sdk.responses.create(model=MODEL, input="plain", text={"format": {"type": "text"}}, store=False)
    assert not stack.worker.calls[2].sampling.HasField("constraint")


# ---- stored responses ---------------------------------------------------------------------------------


@pytest.mark.integration
async def test_a_stored_chain_continues_and_is_one_workflow(stack: Stack) -> None:
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="first question", instructions=SYSTEM)
    assert first.store is True  # OpenAI's default
    second = await sdk.responses.create(
        model=MODEL, input="second question", previous_response_id=first.id, instructions="Now the coder."
    )
    assert second.previous_response_id == first.id
    # Instructions are not carried over; the earlier turns are, with the earlier answer.
    assert chat_of(stack.worker.calls[1]) == [
        ("system", "Now the coder."),
        ("user", "first question"),
        ("assistant", "Hello, world!"),
        ("user", "second question"),
    ]
    third = await sdk.responses.create(model=MODEL, input="third", previous_response_id=second.id)
    assert [m.content for m in stack.worker.calls[2].chat.messages] == [
        "first question", "Hello, world!", "second question", "Hello, world!", "third"
    ]  # fmt: skip
    # Every call of the chain is one workflow, named after its first response; the agent is the
    # system prompt's hash.
    records = [await stack.records.next() for _ in range(3)]
    assert [r.app_metadata.workflow_id for r in records] == [first.id] * 3
    assert [r.app_metadata.workflow_type_id for r in records] == ["session"] * 3
    assert [r.app_metadata.agent_id for r in records] == [
        sys_agent(SYSTEM), sys_agent("Now the coder."), "default"
    ]  # fmt: skip
    assert [s.app_metadata.workflow_id for s in stack.scheduler.schedule_calls] == [first.id] * 3

    # GET gives the response back as it was returned; DELETE removes it.
    fetched = await sdk.responses.retrieve(second.id)
    assert fetched.model_dump() == second.model_dump()
    async with httpx.AsyncClient(base_url=stack.url) as http:
        deleted = await http.delete(f"/v1/responses/{first.id}")
        assert deleted.json() == {"id": first.id, "object": "response", "deleted": True}
        assert refusal(await http.delete(f"/v1/responses/{first.id}"), 404)["code"] == "response_not_found"
        gone = refusal(await http.get(f"/v1/responses/{first.id}"), 404)
        assert (gone["param"], gone["code"]) == ("response_id", "response_not_found")
    with pytest.raises(openai.NotFoundError) as caught:
        await sdk.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    assert caught.value.code == "previous_response_not_found" and caught.value.param == "previous_response_id"
    # The rest of the chain stands on its own rows.
    await sdk.responses.create(model=MODEL, input="fourth", previous_response_id=third.id)
    assert len(stack.worker.calls[-1].chat.messages) == 7


@pytest.mark.integration
async def test_a_chain_stored_in_postgresql(make_stack: StackFactory, postgres_url: str | None) -> None:
    url = postgres_url or LOCAL_POSTGRES
    stack = await make_stack(gateway_responses_database_url=url)
    sdk = client(stack)
    try:
        first = await sdk.responses.create(model=MODEL, input="one")
    except openai.InternalServerError:
        pytest.skip(f"no PostgreSQL at {url}: set CV_TEST_DATABASE_URL")
    second = await sdk.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert chat_of(stack.worker.calls[1]) == [
        ("user", "one"),
        ("assistant", "Hello, world!"),
        ("user", "two"),
    ]
    assert (await sdk.responses.retrieve(second.id)).previous_response_id == first.id
    for response in (first, second):
        await sdk.responses.delete(response.id)


@pytest.mark.integration
async def test_a_streamed_response_is_stored_and_continued(stack: Stack) -> None:
    sdk = client(stack)
    async with sdk.responses.stream(model=MODEL, input="one") as stream:
        final = await stream.get_final_response()
    fetched = await sdk.responses.retrieve(final.id)
    assert fetched.output_text == "Hello, world!" and fetched.status == "completed"
    await sdk.responses.create(model=MODEL, input="two", previous_response_id=final.id)
    assert chat_of(stack.worker.calls[1]) == [
        ("user", "one"),
        ("assistant", "Hello, world!"),
        ("user", "two"),
    ]


@pytest.mark.integration
async def test_a_stored_function_call_chain(make_stack: StackFactory) -> None:
    worker = ToolWorker()
    stack = await make_stack(workers=[worker])
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="weather?", tools=[WEATHER_TOOL])
    call = first.output[0]
    assert call.type == "function_call"
    output = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    await sdk.responses.create(model=MODEL, input=output, previous_response_id=first.id)
    sent = worker.calls[-1]
    assert [m.role for m in sent.chat.messages] == ["user", "assistant", "tool"]
    assert [c.id for c in sent.chat.messages[1].tool_calls] == ["call_0x"]
    assert (sent.chat.messages[2].tool_call_id, sent.chat.messages[2].name) == ("call_0x", "get_weather")


@pytest.mark.integration
async def test_session_headers_and_tags_win_over_the_chain(stack: Stack) -> None:
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="a")
    await sdk.responses.create(
        model=MODEL, input="b", previous_response_id=first.id,
        extra_headers={"x-claude-code-session-id": "sess-1", "x-workflow-type-id": "coding"},
    )  # fmt: skip
    tagged = {"workflow_type_id": "triage", "workflow_id": "wf-9", "agent_id": "planner"}
    await sdk.responses.create(
        model=MODEL, input="c", previous_response_id=first.id, extra_body={"app_metadata": tagged}
    )
    records = [await stack.records.next() for _ in range(3)]
    metas = [
        (r.app_metadata.workflow_type_id, r.app_metadata.workflow_id, r.app_metadata.agent_id)
        for r in records
    ]
    assert metas == [
        ("session", first.id, "default"),
        ("coding", "sess-1", "default"),
        ("triage", "wf-9", "planner"),
    ]
    # A store: false request with no chain and no session stays untagged.
    await sdk.responses.create(model=MODEL, input="d", store=False)
    assert not (await stack.records.next()).HasField("app_metadata")


@pytest.mark.integration
async def test_session_tagging_off_leaves_chains_untagged(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_session_headers="")
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="a")
    await sdk.responses.create(model=MODEL, input="b", previous_response_id=first.id)
    records = [await stack.records.next() for _ in range(2)]
    assert [r.HasField("app_metadata") for r in records] == [False, False]


@pytest.mark.integration
async def test_responses_belong_to_their_tenant(make_stack: StackFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    keys = KeyStore(url)
    acme, _ = keys.create("acme")
    globex, _ = keys.create("globex")
    keys.close()
    stack = await make_stack(database_url=url)
    mine = await client(stack, acme).responses.create(model=MODEL, input="secret plan")
    theirs = client(stack, globex)
    with pytest.raises(openai.NotFoundError) as caught:
        await theirs.responses.retrieve(mine.id)
    assert caught.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError) as caught:
        await theirs.responses.create(model=MODEL, input="x", previous_response_id=mine.id)
    assert caught.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        await theirs.responses.delete(mine.id)
    assert (await client(stack, acme).responses.retrieve(mine.id)).id == mine.id  # still there
    assert len(stack.worker.calls) == 1  # the refused continuation generated nothing


@pytest.mark.integration
async def test_a_chain_past_its_limit_is_refused(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_responses_max_chain=2)
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="1")
    second = await sdk.responses.create(model=MODEL, input="2", previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError) as caught:
        await sdk.responses.create(model=MODEL, input="3", previous_response_id=second.id)
    assert (caught.value.code, caught.value.param) == ("conversation_too_long", "previous_response_id")
    assert len(stack.worker.calls) == 2


@pytest.mark.integration
async def test_stored_responses_expire(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_responses_ttl_s=0.3)
    sdk = client(stack)
    first = await sdk.responses.create(model=MODEL, input="1")
    assert (await sdk.responses.retrieve(first.id)).id == first.id
    await asyncio.sleep(0.4)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(first.id)


# ---- refusals -----------------------------------------------------------------------------------


BAD_BODIES: list[tuple[dict[str, Any], str, str]] = [
    ({"input": "x"}, "model", "missing_required_parameter"),
    ({"model": MODEL, "input": 5}, "input", "invalid_type"),
    ({"model": MODEL, "input": []}, "input", "missing_required_parameter"),
    ({"model": MODEL, "instructions": "only a system turn"}, "input", "missing_required_parameter"),
    ({"model": MODEL, "input": ["x"]}, "input[0]", "invalid_type"),
    ({"model": MODEL, "input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value"),
    ({"model": MODEL, "input": [{"role": "user", "content": 3}]}, "input[0].content", "invalid_type"),
    (
        {
            "model": MODEL,
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}],
        },
        "input[0].content[0]",
        "unsupported_content",
    ),
    (
        {"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]},
        "input[0].type",
        "unsupported_content",
    ),
    (
        {"model": MODEL, "input": [{"type": "reasoning", "summary": []}]},
        "input[0].type",
        "unsupported_content",
    ),
    (
        {"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
        "input[0].arguments",
        "invalid_type",
    ),
    (
        {"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]},
        "input[0].call_id",
        "invalid_type",
    ),
    ({"model": MODEL, "input": "x", "tools": {"type": "function"}}, "tools", "invalid_type"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_tool"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type", "unsupported_tool"),
    (
        {"model": MODEL, "input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]},
        "tools[0].name",
        "missing_required_parameter",
    ),
    (
        {"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "a b"}]},
        "tools[0].name",
        "invalid_value",
    ),
    (
        {
            "model": MODEL,
            "input": "x",
            "tools": [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}],
        },
        "tools[1].name",
        "duplicate_tool",
    ),
    (
        {"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f", "parameters": "{}"}]},
        "tools[0].parameters",
        "invalid_type",
    ),
    (
        {"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f", "strict": "yes"}]},
        "tools[0].strict",
        "invalid_type",
    ),
    ({"model": MODEL, "input": "x", "tool_choice": "required"}, "tool_choice", "invalid_value"),
    (
        {
            "model": MODEL,
            "input": "x",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "nope"},
        },
        "tool_choice.name",
        "invalid_value",
    ),
    (
        {
            "model": MODEL,
            "input": "x",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "web_search_preview"},
        },
        "tool_choice",
        "unsupported_tool_choice",
    ),
    (
        {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}},
        "text.format.schema",
        "invalid_type",
    ),
    (
        {"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
        "text.format.name",
        "invalid_type",
    ),
    (
        {"model": MODEL, "input": "x", "text": {"format": {"type": "grammar"}}},
        "text.format.type",
        "invalid_value",
    ),
    ({"model": MODEL, "input": "x", "text": {"verbosity": "low"}}, "text.verbosity", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 10**6}, "max_output_tokens", "invalid_value"),
    ({"model": MODEL, "input": "x", "temperature": 3}, "temperature", "invalid_value"),
    ({"model": MODEL, "input": "x", "top_p": 0}, "top_p", "invalid_value"),
    ({"model": MODEL, "input": "x", "stream": "yes"}, "stream", "invalid_type"),
    ({"model": MODEL, "input": "x", "store": 1}, "store", "invalid_type"),
    ({"model": MODEL, "input": "x", "metadata": {"k": 1}}, "metadata.k", "invalid_type"),
    (
        {"model": MODEL, "input": "x", "metadata": {str(i): "v" for i in range(17)}},
        "metadata",
        "array_above_max_length",
    ),
    ({"model": MODEL, "input": "x", "previous_response_id": ""}, "previous_response_id", "invalid_value"),
    (
        {"model": MODEL, "input": "x", "app_metadata": {"workflow_id": "w"}},
        "app_metadata.workflow_type_id",
        "invalid_app_metadata",
    ),
    ({"model": MODEL, "input": "x", "reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    (
        {"model": MODEL, "input": "x", "include": ["message.output_text.logprobs"]},
        "include",
        "unsupported_parameter",
    ),
    ({"model": MODEL, "input": "x", "background": True}, "background", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "truncation": "auto"}, "truncation", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "top_logprobs": 3}, "top_logprobs", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "max_tool_calls": 2}, "max_tool_calls", "unsupported_parameter"),
    ({"model": MODEL, "input": "x", "messages": []}, "messages", "unknown_parameter"),
]


@pytest.mark.integration
async def test_every_bad_body_is_a_400_naming_its_param(stack: Stack) -> None:
    for body, param, code in BAD_BODIES:
        error = refusal(await post(stack, body), 400)
        assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), body
    assert stack.worker.calls == [] and stack.scheduler.schedule_calls == []
    # Values that ask for nothing pass, as SDKs and agent frameworks send them.
    neutral = {
        "include": [], "reasoning": {}, "background": False, "truncation": "disabled", "top_logprobs": 0,
        "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s", "user": "u",
        "stream_options": {"include_obfuscation": False}, "text": {"verbosity": "medium"}, "tool_choice": "auto",
        "tools": [], "store": False,
    }  # fmt: skip
    response = await post(stack, {"model": MODEL, "input": "x", **neutral})
    assert response.status_code == 200, response.text
    assert response.json()["user"] == "u"


@pytest.mark.integration
async def test_the_sdk_raises_on_a_refusal(stack: Stack) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client(stack).responses.create(model=MODEL, input="x", tools=[{"type": "web_search"}])
    assert (caught.value.param, caught.value.code) == ("tools[0].type", "unsupported_tool")


@pytest.mark.integration
async def test_lenient_parameters_drop_unknown_fields(make_stack: StackFactory) -> None:
    stack = await make_stack(gateway_lenient_parameters=True)
    response = await post(stack, {"model": MODEL, "input": "x", "store": False, "frobnicate": 1})
    assert response.status_code == 200, response.text
    refused = refusal(await post(stack, {"model": MODEL, "input": "x", "reasoning": {"effort": "low"}}), 400)
    assert refused["param"] == "reasoning"  # refused parameters stay refused


@pytest.mark.integration
async def test_a_bad_session_header_is_refused(stack: Stack) -> None:
    error = refusal(await post(stack, {"model": MODEL, "input": "x"}, **{"x-session-id": "has spaces"}), 400)
    assert (error["param"], error["code"]) == ("x-session-id", "invalid_session_header")


# ---- a store that is down ----------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung database."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.integration
async def test_a_dead_store_fails_only_what_needs_it(make_stack: StackFactory) -> None:
    dead = f"postgresql://cv@127.0.0.1:{closed_port()}/test"
    stack = await make_stack(gateway_responses_database_url=dead, gateway_responses_timeout_s=2.0)
    sdk = client(stack)
    reply = await sdk.responses.create(model=MODEL, input="x", store=False)
    assert reply.output_text == "Hello, world!"
    for request in (
        sdk.responses.create(model=MODEL, input="x"),
        sdk.responses.create(model=MODEL, input="x", store=False, previous_response_id="resp_1"),
        sdk.responses.retrieve("resp_1"),
    ):
        with pytest.raises(openai.InternalServerError) as caught:
            await request
        assert caught.value.status_code == 503 and caught.value.code == "response_store_unavailable"
    assert len(stack.worker.calls) == 1  # nothing generated for a request that could not be stored


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.integration
async def test_a_write_that_fails_after_the_generation(
    make_stack: StackFactory, tmp_path: Path, stream: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'responses.db'}"
    worker = FakeWorker(delay_s=0.3)
    stack = await make_stack(workers=[worker], gateway_responses_database_url=url)
    answer = asyncio.create_task(post(stack, {"model": MODEL, "input": "x", "stream": stream}))
    while not worker.calls:  # the store was checked before the worker was called
        await asyncio.sleep(0.01)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(text("DROP TABLE stored_responses"))
    engine.dispose()
    response = await answer
    if not stream:
        assert refusal(response, 503)["code"] == "response_store_unavailable"
        return
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-2:] == ["response.output_item.done", "error"]
    assert events[-1]["code"] == "response_store_unavailable"


@pytest.mark.integration
async def test_a_hung_store_answers_503_within_its_deadline(
    make_stack: StackFactory, silent_server: int
) -> None:
    hung = f"postgresql://cv@127.0.0.1:{silent_server}/test"
    stack = await make_stack(gateway_responses_database_url=hung, gateway_responses_timeout_s=0.5)
    began = time.monotonic()
    error = refusal(await post(stack, {"model": MODEL, "input": "x"}), 503)
    assert error["code"] == "response_store_unavailable" and "did not answer within 0.5 s" in error["message"]
    assert time.monotonic() - began < 3.0
    assert (await post(stack, {"model": MODEL, "input": "x", "store": False})).status_code == 200
