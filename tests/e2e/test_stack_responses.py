"""The Responses API end to end on a real stack (tiny-random): a plain response, a stored chain that
the profiler sees as one workflow, and an OpenAI Agents SDK run that calls a tool."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import agents
import grpc
import jsonschema
import pytest
from agents import Agent, ModelSettings, Runner, function_tool
from agents.items import ToolCallItem
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.stack import Stack, StackConfig
from tests.e2e.conftest import records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MODEL = "tiny-random"
SYSTEM = "You are a weather assistant."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack-responses")
    config = StackConfig.on_free_ports(
        var,
        model=MODEL,
        workers=1,
        # The Annotate deadline only bounds a hung call here: a loaded machine can hold the
        # profiler off past the default 5 ms, and this test looks at what it answered.
        env={"CV_PROFILER_TIMEOUT_S": "10.0"},
        worker_env={"CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "256", "CV_MAX_NUM_SEQS": "16"},
    )
    stack = Stack(config).start(ready_timeout=180)
    try:
        yield stack
    finally:
        stack.stop()


def client(stack: Stack) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=60)


def profile_seen(stack: Stack, workflow_type: str) -> bool:
    with grpc.insecure_channel(stack.profiler_address) as channel:
        stub = profiler_pb2_grpc.ProfilerStub(channel)
        try:
            stub.GetProfile(
                profiler_pb2.GetProfileRequest(tenant="default", workflow_type_id=workflow_type), timeout=10
            )
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise
    return True


def wait_for_profile(stack: Stack, workflow_type: str, timeout_s: float = 60.0) -> None:
    """Until the profiler has ingested records of ``workflow_type`` (it then annotates its calls)."""
    deadline = time.monotonic() + timeout_s
    while not profile_seen(stack, workflow_type):
        assert time.monotonic() < deadline, f"the profiler never saw the {workflow_type} workflow type"
        time.sleep(0.2)


def assert_annotated(record: common_pb2.CompletionRecord) -> None:
    """The call was scheduled with the profiler's annotations (at least the shadow tier)."""
    assert record.HasField("annotations")
    assert record.annotations.confidence in (
        common_pb2.CONFIDENCE_SHADOW,
        common_pb2.CONFIDENCE_LOW,
        common_pb2.CONFIDENCE_HIGH,
    )


async def test_a_plain_response(stack: Stack) -> None:
    async with client(stack) as sdk:
        reply = await sdk.responses.create(model=MODEL, input="hello there", max_output_tokens=8, store=False)
    assert reply.status in ("completed", "incomplete") and reply.model == MODEL
    [message] = reply.output
    assert message.type == "message" and isinstance(reply.output_text, str)
    assert reply.usage is not None and 1 <= reply.usage.output_tokens <= 8 and reply.usage.input_tokens > 0
    assert (reply.status == "incomplete") == (reply.usage.output_tokens == 8)
    [record] = await records(stack, 1, request_ids={reply.id.removeprefix("resp_")})
    assert (record.endpoint, record.output_tokens, record.prompt_tokens) == (
        "responses",
        reply.usage.output_tokens,
        reply.usage.input_tokens,
    )


async def test_a_stored_chain_is_one_workflow_the_profiler_annotates(stack: Stack) -> None:
    async with client(stack) as sdk:
        await run_chain(stack, sdk)


async def run_chain(stack: Stack, sdk: AsyncOpenAI) -> None:
    first = await sdk.responses.create(
        model=MODEL, input="first turn", instructions=SYSTEM, max_output_tokens=6
    )
    second = await sdk.responses.create(
        model=MODEL,
        input="second turn",
        instructions=SYSTEM,
        previous_response_id=first.id,
        max_output_tokens=6,
    )
    assert second.previous_response_id == first.id
    assert (await sdk.responses.retrieve(second.id)).output_text == second.output_text
    # The second prompt holds the first turn and its answer.
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens
    chain = await records(stack, 2, workflow_id=first.id)
    assert sorted(r.request_id for r in chain) == sorted(r.id.removeprefix("resp_") for r in (first, second))
    agent = "sys-" + hashlib.sha256(SYSTEM.encode()).hexdigest()[:12]
    assert {(r.app_metadata.workflow_type_id, r.app_metadata.agent_id) for r in chain} == {("session", agent)}

    # Once the profiler has ingested the chain's records it knows the workflow type, and the next
    # call of the conversation is scheduled with its annotations (at least the shadow tier).
    wait_for_profile(stack, "session")
    third = await sdk.responses.create(
        model=MODEL,
        input="third turn",
        instructions=SYSTEM,
        previous_response_id=second.id,
        max_output_tokens=6,
    )
    [record] = await records(stack, 1, request_ids={third.id.removeprefix("resp_")})
    assert record.app_metadata.workflow_id == first.id
    assert_annotated(record)


async def test_an_agents_sdk_run_calls_its_tool(stack: Stack) -> None:
    agents.set_tracing_disabled(True)
    sdk = client(stack)
    ran: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Lyon"]) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agent = Agent(
        name="weather",
        instructions=SYSTEM,
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=sdk),
        # tiny-random writes random text (and random whitespace inside the JSON the grammar allows):
        # force the call, leave it room, and end the run with the tool's output.
        model_settings=ModelSettings(tool_choice="get_weather", max_tokens=1024),
        tool_use_behavior="stop_on_first_tool",
    )
    async with sdk:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=2)
    assert len(ran) == 1 and ran[0] in ("Paris", "Lyon")
    assert result.final_output == f"sunny in {ran[0]}"
    [call] = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, get_weather.params_json_schema)
    assert arguments == {"city": ran[0]}


async def test_claude_code_session_headers_alone_make_one_annotated_workflow(stack: Stack) -> None:
    # Untagged chat traffic, as Claude Code sends it: no app_metadata, only its session header.
    headers = {"x-claude-code-session-id": "cc-session-7", "x-workflow-type-id": "claude-code"}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the bug"}]
    async with client(stack) as sdk:
        replies = [
            await sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, extra_headers=headers)
            for _ in range(2)
        ]
        calls = await records(stack, 2, workflow_id="cc-session-7")
        assert sorted(r.request_id for r in calls) == sorted(r.id.removeprefix("chatcmpl-") for r in replies)
        agent = "sys-" + hashlib.sha256(SYSTEM.encode()).hexdigest()[:12]
        assert {(r.app_metadata.workflow_type_id, r.app_metadata.agent_id) for r in calls} == {("claude-code", agent)}

        # The profiler learns the session's workflow type from those records; the next call of the
        # session is then annotated, and the annotation is what the scheduler placed it with.
        wait_for_profile(stack, "claude-code")
        third = await sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, extra_headers=headers)
    [record] = await records(stack, 1, request_ids={third.id.removeprefix("chatcmpl-")})
    assert record.app_metadata.workflow_id == "cc-session-7"
    assert_annotated(record)
