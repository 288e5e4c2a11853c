"""Tool calls through the worker's real gRPC server on tiny-random: the grammar makes every call
parse and follow its tool's schema, the stream's pieces spell the whole answer's calls, and each
of n choices is parsed on its own."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import jsonschema
import openai
import pytest

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.blockhash import sequence_hashes
from clairvoyant.core.grpc_errors import from_rpc_error
from clairvoyant.core.grpcutil import channel, new_server
from clairvoyant.core.structured import ToolCall, ToolSpec, assemble_calls
from clairvoyant.core.wire import tool_to_proto
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.http_api import create_app
from clairvoyant.worker.runners.loader import load_runner
from clairvoyant.worker.tools import HERMES, ToolCallParser
from tests.worker.test_tools import random_schema

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]



@dataclass
class Worker:
    stub: worker_pb2_grpc.WorkerStub
    openai: openai.AsyncOpenAI  # the worker's own HTTP endpoint, in process


@pytest.fixture
async def worker() -> AsyncIterator[Worker]:
    runner = load_runner("tiny-random", max_model_len=4096)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=2048, max_num_seqs=8)))
    engine.start()
    settings = WorkerSettings(worker_id="w-tools", block_size=16, heartbeat_interval_s=0.5)
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    frontend = WorkerFrontend(runner, engine, "w-tools")
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(frontend, heartbeat), server)
    await server.start()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(frontend, heartbeat)))
    client = openai.AsyncOpenAI(base_url="http://worker/v1", api_key="unused", http_client=http, max_retries=0)
    async with channel(f"127.0.0.1:{port}") as chan:
        yield Worker(worker_pb2_grpc.WorkerStub(chan), client)
    await http.aclose()
    await server.stop(None)
    engine.stop()


@pytest.fixture
def stub(worker: Worker) -> worker_pb2_grpc.WorkerStub:
    return worker.stub


def request(
    tools: list[ToolSpec],
    choice: common_pb2.ToolChoice,
    *,
    seed: int,
    n: int = 1,
    parallel: bool = False,
    request_id: str = "",
) -> worker_pb2.GenerateRequest:
    return worker_pb2.GenerateRequest(
        request_id=request_id or f"tools-{seed}",
        chat=worker_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role="user", content="Call a tool.")]),
        # max_tokens unset: the rest of tiny-random's 2,048 positions after the prompt and its tools
        sampling=common_pb2.SamplingParams(temperature=1.0, seed=seed, n=n),
        tools=[tool_to_proto(tool) for tool in tools],
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )


class Answer:
    """One choice's replies: its content, call pieces, raw tokens and finish reason."""

    def __init__(self) -> None:
        self.text = ""
        self.deltas: list[common_pb2.ToolCallDelta] = []
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return assemble_calls(self.deltas)

    def whole_answer_calls(self) -> tuple[tuple[str, str], ...]:
        """The raw output (bytes, tiny-random's tokens) parsed in one piece."""
        raw = bytes(t for t in self.token_ids if t < 256).decode("utf-8", errors="replace")
        parser = ToolCallParser(HERMES)
        parsed, rest = parser.feed(raw), parser.finish()
        return tuple((c.name, c.arguments) for c in assemble_calls([*parsed.calls, *rest.calls]))


async def generate(
    stub: worker_pb2_grpc.WorkerStub, req: worker_pb2.GenerateRequest
) -> tuple[dict[int, Answer], list[worker_pb2.GenerateResponse]]:
    answers: dict[int, Answer] = {}
    replies = []
    async for reply in stub.Generate(req):
        replies.append(reply)
        answer = answers.setdefault(reply.index, Answer())
        answer.text += reply.text
        answer.deltas.extend(reply.tool_calls)
        answer.token_ids.extend(reply.token_ids)
        if reply.HasField("finish_reason"):
            answer.finish_reason = reply.finish_reason
    return answers, replies


def check_calls(answer: Answer, tools: dict[str, ToolSpec], only: str | None = None) -> None:
    raw = bytes(t for t in answer.token_ids if t < 256)
    assert answer.finish_reason == "tool_calls", raw
    assert answer.calls, raw
    for call in answer.calls:
        assert call.id.startswith("call_")
        assert call.name in tools and (only is None or call.name == only)
        try:
            jsonschema.validate(json.loads(call.arguments), tools[call.name].schema())
        except (ValueError, jsonschema.ValidationError) as exc:
            raise AssertionError(f"{call} of {raw!r}") from exc
    assert tuple((c.name, c.arguments) for c in answer.calls) == answer.whole_answer_calls()


async def test_required_and_named_calls_follow_fifty_random_bounded_schemas(
    stub: worker_pb2_grpc.WorkerStub,
) -> None:
    rng = random.Random(2024)
    cases = []
    for i in range(50):
        tools = [ToolSpec(f"tool_{i}_{k}", "", random_schema(rng)) for k in range(rng.randint(1, 2))]
        if i % 2:
            choice = common_pb2.ToolChoice(mode=common_pb2.ToolChoice.REQUIRED)
            only = None
        else:
            only = rng.choice(tools).name
            choice = common_pb2.ToolChoice(mode=common_pb2.ToolChoice.FUNCTION, function_name=only)
        cases.append((tools, choice, only, request(tools, choice, seed=i)))
    results = await asyncio.gather(*(generate(stub, req) for *_, req in cases))
    for (tools, _, only, _), (answers, replies) in zip(cases, results, strict=True):
        assert list(answers) == [0]
        check_calls(answers[0], {t.name: t for t in tools}, only)
        assert len(answers[0].calls) == 1  # parallel calls off: exactly one
        assert replies[-1].usage.completion_tokens == len(answers[0].token_ids)


async def test_streamed_call_pieces_open_with_id_and_name(stub: worker_pb2_grpc.WorkerStub) -> None:
    tool = ToolSpec("lookup", "", {"type": "object", "properties": {"q": {"type": "string", "maxLength": 5}},
                                   "required": ["q"]})  # fmt: skip
    choice = common_pb2.ToolChoice(mode=common_pb2.ToolChoice.FUNCTION, function_name="lookup")
    answers, replies = await generate(stub, request([tool], choice, seed=3))
    first = answers[0].deltas[0]
    assert (first.index, first.name, first.arguments) == (0, "lookup", "")
    assert first.id.startswith("call_")
    assert all(not d.id and not d.name for d in answers[0].deltas[1:])
    assert sum(len(r.tool_calls) > 0 for r in replies) > 2  # the arguments streamed over several replies
    assert answers[0].text == ""
    assert [r.HasField("finish_reason") for r in replies] == [False] * (len(replies) - 1) + [True]


async def test_two_choices_with_tools_are_each_parsed(stub: worker_pb2_grpc.WorkerStub) -> None:
    tools = [
        ToolSpec("add", "", {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "required": ["a"]}),
        ToolSpec("say", "", {"type": "object", "properties": {"s": {"enum": ["hi", "yo"]}}, "required": ["s"]}),
    ]  # fmt: skip
    choice = common_pb2.ToolChoice(mode=common_pb2.ToolChoice.REQUIRED)
    answers, replies = await generate(stub, request(tools, choice, seed=11, n=2))
    assert sorted(answers) == [0, 1]
    for answer in answers.values():
        check_calls(answer, {t.name: t for t in tools})
    ids = [c.id for answer in answers.values() for c in answer.calls]
    assert len(set(ids)) == len(ids)
    last = replies[-1]
    assert [r.HasField("usage") for r in replies].count(True) == 1 and last.HasField("usage")
    assert last.usage.completion_tokens == sum(len(a.token_ids) for a in answers.values())
    assert list(last.prompt_token_ids) and last.usage.prompt_tokens == len(last.prompt_token_ids)


async def test_the_prompt_carries_the_tools(stub: worker_pb2_grpc.WorkerStub) -> None:
    tool = ToolSpec("weather", "Current weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    choice = common_pb2.ToolChoice(mode=common_pb2.ToolChoice.NONE)
    req = request([tool], choice, seed=1)
    req.sampling.max_tokens = 4
    answers, replies = await generate(stub, req)
    prompt = bytes(t for t in replies[-1].prompt_token_ids if t < 256).decode()
    assert "# Tools" in prompt and json.dumps(tool.openai()) in prompt
    assert answers[0].finish_reason == "length" and answers[0].deltas == []  # none: nothing is parsed


async def test_tool_choice_none_leaves_calls_as_text(stub: worker_pb2_grpc.WorkerStub) -> None:
    # The same seed with and without parsing: identical tokens; none returns them all as text.
    tool = ToolSpec("lookup", "", {"type": "object", "properties": {"q": {"type": "string", "maxLength": 3}}})
    none = request([tool], common_pb2.ToolChoice(mode=common_pb2.ToolChoice.NONE), seed=5)
    none.sampling.max_tokens = 16
    answers, _ = await generate(stub, none)
    raw = bytes(t for t in answers[0].token_ids if t < 256).decode("utf-8", errors="replace")
    assert answers[0].text == raw and answers[0].deltas == []


@pytest.mark.parametrize(
    ("mutate", "param"),
    [
        (lambda r: r.tool_choice.CopyFrom(common_pb2.ToolChoice(mode=common_pb2.ToolChoice.FUNCTION,
                                                                 function_name="nope")), "tool_choice"),  # fmt: skip
        (lambda r: r.sampling.constraint.CopyFrom(common_pb2.OutputConstraint(json_object=True)), "response_format"),
        (lambda r: r.ClearField("tools"), "tool_choice"),
        (  # a schema xgrammar cannot compile
            lambda r: r.tools[0].CopyFrom(
                tool_to_proto(ToolSpec("lookup", "", {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}))
            ),
            "tools",
        ),
    ],
)
async def test_requests_the_tools_cannot_serve_are_invalid_argument(
    stub: worker_pb2_grpc.WorkerStub, mutate: Any, param: str
) -> None:
    tool = ToolSpec("lookup", "", {"type": "object"})
    req = request([tool], common_pb2.ToolChoice(mode=common_pb2.ToolChoice.REQUIRED), seed=0)
    mutate(req)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await generate(stub, req)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert from_rpc_error(raised.value).param == param


WEATHER_TOOL: Any = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [WEATHER_TOOL]}, "tools"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tools"),
        ({"n": 2}, "n"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
    ],
)
async def test_the_workers_own_endpoint_refuses_what_it_does_not_serve(
    worker: Worker, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        await worker.openai.chat.completions.create(
            model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
        )
    assert raised.value.status_code == 400
    assert raised.value.param == param  # OpenAI's error body


async def test_the_workers_own_endpoint_renders_tools_with_tool_choice_none(worker: Worker) -> None:
    history: Any = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "4C"},
    ]  # fmt: skip
    out = await worker.openai.chat.completions.create(
        model="tiny-random", messages=history, max_tokens=3, tools=[WEATHER_TOOL], tool_choice="none",
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 3
    with_tools = out.usage.prompt_tokens
    plain = await worker.openai.chat.completions.create(
        model="tiny-random", messages=history, max_tokens=3, extra_body={"ignore_eos": True}
    )
    assert plain.usage is not None and with_tools > plain.usage.prompt_tokens  # the tools are in the prompt


async def test_n_choices_stream_interleaved_and_the_last_reply_counts_them_all(
    stub: worker_pb2_grpc.WorkerStub,
) -> None:
    prompt = [(7 * i + 3) % 200 for i in range(40)]
    req = worker_pb2.GenerateRequest(
        request_id="n3",
        token_ids=worker_pb2.TokenIds(ids=prompt),
        sampling=common_pb2.SamplingParams(max_tokens=20, temperature=1.0, seed=9, ignore_eos=True, n=3),
    )
    answers, replies = await generate(stub, req)
    assert sorted(answers) == [0, 1, 2]
    assert all(len(a.token_ids) == 20 and a.finish_reason == "length" for a in answers.values())
    assert len({tuple(a.token_ids) for a in answers.values()}) == 3  # each choice samples on its own
    for answer in answers.values():  # no tools: the text is all the tokens'
        assert answer.text == bytes(t for t in answer.token_ids if t < 256).decode("utf-8", errors="replace")
        assert answer.deltas == []
    finishing = [r for r in replies if r.HasField("finish_reason")]
    assert sorted(r.index for r in finishing) == [0, 1, 2]
    last = replies[-1]
    assert last is finishing[-1]
    assert [r.HasField("usage") for r in replies] == [False] * (len(replies) - 1) + [True]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (40, 60, 100)
    expected_prompt, expected_response = sequence_hashes(prompt, answers[0].token_ids)
    assert list(last.prompt_block_hashes) == expected_prompt
    assert list(last.response_block_hashes) == expected_response  # the first choice's
    assert list(last.prompt_token_ids) == prompt
    assert all(not r.prompt_token_ids and not r.response_block_hashes for r in replies[:-1])
    assert replies[0].prompt_tokens == 40
