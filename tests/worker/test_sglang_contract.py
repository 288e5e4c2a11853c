"""The SGLang adapter against SGLang's HTTP API, as its source defines it (SGLang 0.5.23).

SGLang needs CUDA wheels, so it is not installed here: ``FakeSglang`` serves the endpoints the
adapter uses with SGLang's request and response shapes, recorded from its source (paths under
``python/sglang/`` in sgl-project/sglang), and records every request.  The real ``SglangAdapter``
runs behind the real ``ExternalFrontend``.  The last test starts a real SGLang server where one can
run (a CUDA device and ``import sglang``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from clairvoyant.contracts.v1 import cachemgr_pb2
from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.stack.natsserver import free_port
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.core.types import RequestOutput
from clairvoyant.worker.directives import DirectiveRejected
from clairvoyant.worker.engines.adapter import EngineCall, LaunchSpec, integer_priority
from clairvoyant.worker.engines.frontend import PRE_PREFILL_PRIORITY, ExternalFrontend, engine_model_info
from clairvoyant.worker.engines.sglang import SglangAdapter
from clairvoyant.worker.frontend import PromptInput

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "smol"
CONTEXT_LEN = 8192

# Server arguments, from srt/arg_groups/fields/{model,serving,schedule,memory,observability,device,
# parallel,exec_}.py (each field ``x_y`` is the flag ``--x-y``, plus its aliases): the flags the
# adapter passes and those an operator adds through CV_ENGINE_ARGS.
SGLANG_SERVER_FLAGS = frozenset({
    "--model-path", "--model", "--served-model-name", "--tokenizer-path", "--trust-remote-code", "--dtype",
    "--kv-cache-dtype", "--host", "--port", "--device", "--context-length", "--max-running-requests",
    "--max-queued-requests", "--max-total-tokens", "--mem-fraction-static", "--chunked-prefill-size",
    "--page-size", "--schedule-policy", "--enable-priority-scheduling", "--schedule-low-priority-values-first",
    "--default-priority-value", "--priority-scheduling-preemption-threshold", "--disable-radix-cache",
    "--enable-hierarchical-cache", "--enable-hicache", "--hicache-ratio", "--hicache-size",
    "--hicache-write-policy", "--hicache-storage-backend", "--hicache-storage-backend-extra-config",
    "--enable-metrics", "--enable-metrics-for-all-schedulers", "--decode-log-interval", "--kv-events-config",
    "--incremental-streaming-output", "--enable-cache-report", "--enable-deterministic-inference",
    "--skip-server-warmup", "--log-level", "--api-key", "--random-seed", "--tp-size", "--tensor-parallel-size",
    "--attention-backend",
})  # fmt: skip
# KVEventsConfig's fields (srt/disaggregation/kv_events.py).
KV_EVENTS_CONFIG_FIELDS = frozenset(
    {
        "publisher",
        "endpoint",
        "bind",
        "replay_endpoint",
        "buffer_steps",
        "hwm",
        "max_queue_size",
        "topic",
        "format",
    }
)
# GenerateRequest's fields (api/v1/api_types.py: unknown keys are ignored there, so a misspelt
# field would be lost silently; the test checks that every key the adapter sends is one of these).
GENERATE_REQUEST_FIELDS = frozenset({
    "rid", "text", "input_ids", "stream", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_hidden_states", "return_text_in_logprobs", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "routed_dp_rank",
    "disagg_prefill_dp_rank", "image_data", "mm_hashes", "video_data", "audio_data", "extra_key", "priority",
    "cache_salt", "require_reasoning", "lora_path", "session_params", "kv_hints", "routing_key",
    "max_thinking_tokens", "session_id", "custom_logit_processor", "custom_labels", "images_config",
    "return_prompt_token_ids", "routed_experts_start_len", "return_sampling_mask", "modalities",
})  # fmt: skip


class SglangSampling(BaseModel):
    """SamplingParams of api/v1/api_types.py: unknown keys are rejected."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_new_tokens: int | None = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    top_k: int | None = 1 << 30
    min_p: float | None = 0.0
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    repetition_penalty: float | None = 1.0
    logit_bias: dict[str, float] | None = None
    min_new_tokens: int | None = 0
    n: int | None = 1
    ignore_eos: bool | None = False
    skip_special_tokens: bool | None = True
    no_stop_trim: bool | None = False
    sampling_seed: int | None = None


class SglangGenerate(BaseModel):
    """The GenerateRequest fields the fake serves (types as in api/v1/api_types.py)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    rid: str | None = None
    input_ids: list[int]
    stream: bool = False
    sampling_params: SglangSampling = SglangSampling()
    priority: int | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool = False


class SglangTokenize(BaseModel):
    """TokenizeRequest of srt/entrypoints/openai/protocol.py."""

    model_config = ConfigDict(extra="allow")
    model: str = "default"
    prompt: str | list[str] | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None

    @model_validator(mode="after")
    def exactly_one_input(self) -> SglangTokenize:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("Exactly one of 'prompt' or 'messages' must be provided.")
        return self


BOS, EOS = 1, 2
PIECES = {100: "Hel", 101: "lo", 102: " wor", 103: "ld", 104: "!", EOS: ""}
SCRIPT = (100, 101, 102, 103, 104, EOS)  # what the fake model says, whatever the prompt
PAGE = 16


def chat_ids(messages: list[dict[str, Any]]) -> list[int]:
    """The fake's chat template: ``<role>content`` per message, then ``<assistant>``, as bytes."""
    return list(("".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>").encode())


def error_body(message: str, status: int) -> dict[str, object]:
    """ErrorResponse (srt/entrypoints/openai/protocol.py), as SGLang's handlers send it."""
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": status}


@dataclass
class FakeSglang:
    """SGLang's HTTP server as srt/entrypoints/http_server.py defines the routes used here."""

    context_len: int = CONTEXT_LEN
    metrics_text: str = ""
    fail_status: int | None = None  # /generate and /v1/tokenize answer this status
    abort: bool = False  # the second token comes with an abort (scheduler's FINISH_ABORT) of abort_status
    abort_status: int | None = None
    requests: list[tuple[str, str, Any]] = field(default_factory=list)  # (method, path, JSON body)
    cache: dict[str | None, list[list[int]]] = field(default_factory=dict)
    app: FastAPI = field(default_factory=FastAPI)

    def __post_init__(self) -> None:
        app = self.app

        @app.exception_handler(RequestValidationError)
        async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
            return JSONResponse(error_body(str(exc), 400), status_code=400)  # SGLang turns 422 into 400

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Response:
            body = await request.body()
            self.requests.append((request.method, request.url.path, json.loads(body) if body else None))
            return await call_next(request)

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200)

        @app.get("/v1/models")
        async def models() -> dict[str, object]:
            card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "sglang", "root": MODEL,
                    "parent": None, "max_model_len": self.context_len}  # fmt: skip
            return {"object": "list", "data": [card]}

        @app.post("/v1/tokenize")
        async def tokenize(body: SglangTokenize, request: Request) -> JSONResponse:
            if request.headers.get("content-type", "").split(";")[0] != "application/json":
                return JSONResponse(error_body("Unsupported Media Type", 400), status_code=400)
            if self.fail_status:
                return JSONResponse(
                    error_body("tokenizer failed", self.fail_status), status_code=self.fail_status
                )
            if body.messages is not None:
                tokens = chat_ids(body.messages)
            else:
                tokens = [BOS] * body.add_special_tokens + list(str(body.prompt).encode())
            return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": self.context_len})

        @app.post("/generate")
        async def generate(request: Request) -> Response:
            if self.fail_status:
                return JSONResponse(
                    error_body("engine failed", self.fail_status), status_code=self.fail_status
                )
            try:
                body = SglangGenerate.model_validate(await request.json())
            except ValidationError as exc:  # api_contract.generate_contract_error
                return JSONResponse({"error": str(exc)}, status_code=400)
            return StreamingResponse(self._stream(body), media_type="text/event-stream")

        @app.get("/metrics")
        async def metrics() -> Response:  # --enable-metrics mounts prometheus_client's ASGI app here
            return Response(self.metrics_text, media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT"])
        async def unknown(path: str) -> JSONResponse:
            return JSONResponse({"detail": "Not Found"}, status_code=404)

    def _cached(self, salt: str | None, prompt: list[int]) -> int:
        """Prompt tokens in full pages shared with an earlier prompt of the same salt (at least
        one token is computed)."""
        best = 0
        for earlier in self.cache.get(salt, []):
            common = next((i for i, (a, b) in enumerate(zip(earlier, prompt, strict=False)) if a != b), None)
            best = max(best, common if common is not None else min(len(earlier), len(prompt)))
        self.cache.setdefault(salt, []).append(prompt)
        return min(best, len(prompt) - 1) // PAGE * PAGE

    async def _stream(self, body: SglangGenerate) -> AsyncIterator[bytes]:
        """Cumulative ``text`` and ``output_ids`` per token (tokenizer_manager._handle_batch_output);
        a matched stop string is trimmed from the final text only (detokenizer_manager.trim_matched_stop)."""
        params, prompt = body.sampling_params, body.input_ids
        if len(prompt) > self.context_len:  # TokenizerManager._validate_one_request raises ValueError
            message = (
                f"The input ({len(prompt)} tokens) is longer than the model's context length "
                f"({self.context_len} tokens)."
            )
            error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
            yield b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            return
        stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        max_new, min_new = params.max_new_tokens or 128, params.min_new_tokens or 0
        cached = self._cached(body.cache_salt, prompt)
        ids: list[int] = []
        text = ""
        for step in range(max_new):
            token = SCRIPT[step % len(SCRIPT)]
            ids.append(token)
            text += PIECES[token]
            finish: dict[str, object] | None = None
            matched = next((s for s in stop if s in text), None) if len(ids) >= min_new else None
            if self.abort and len(ids) == 2:
                finish = {
                    "type": "abort",
                    "message": "Aborted",
                    "status_code": self.abort_status,
                    "err_type": None,
                }
            elif token == EOS and not params.ignore_eos and len(ids) > min_new:
                finish = {"type": "stop", "matched": EOS}
            elif matched is not None:
                finish, text = {"type": "stop", "matched": matched}, text[: text.find(matched)]
            elif len(ids) == max_new:
                finish = {"type": "length", "length": max_new}
            meta = {
                "id": body.rid, "finish_reason": finish, "prompt_tokens": len(prompt), "weight_version": "default",
                "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": len(ids), "cached_tokens": cached,
            }  # fmt: skip
            if body.return_logprob:  # cumulative [logprob, id, text] (add_logprob_to_meta_info)
                label = (lambda t: PIECES[t]) if body.return_text_in_logprobs else (lambda t: None)
                meta["output_token_logprobs"] = [[-0.5 * (i + 1), t, label(t)] for i, t in enumerate(ids)]
                if body.top_logprobs_num:
                    meta["output_top_logprobs"] = [
                        [[-0.5 * (i + 1) - r, t + r, label(t)] for r in range(body.top_logprobs_num)]
                        for i, t in enumerate(ids)
                    ]
            chunk = {"text": text, "output_ids": list(ids), "meta_info": meta}
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            if finish is not None:
                break
        yield b"data: [DONE]\n\n"

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for _, recorded, body in self.requests if recorded == path]


# GET /metrics with --enable-metrics and --enable-priority-scheduling, as prometheus_client's
# multiprocess collector renders SGLang's collectors (srt/observability/metrics_collector.py): the
# scheduler's gauges carry priority="" for the total and one series per priority value; the
# tokenizer's counters carry the request's priority.
METRICS_TEXT = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="2500000",tp_rank="0"} 2.0
sglang:num_running_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="-1000000000000000",tp_rank="0"} 1.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 2.0
sglang:num_queue_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="2500000",tp_rank="0"} 0.0
sglang:num_queue_reqs{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="1000000",tp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.25
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 0.5
# HELP sglang:kv_available_tokens Number of free token slots in the KV cache pool.
# TYPE sglang:kv_available_tokens gauge
sglang:kv_available_tokens{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 2496.0
# HELP sglang:kv_evictable_tokens Number of evictable (radix-cached) token slots in the KV cache pool.
# TYPE sglang:kv_evictable_tokens gauge
sglang:kv_evictable_tokens{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 960.0
# HELP sglang:kv_used_tokens Number of actively used token slots in the KV cache pool.
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 640.0
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 4096.0
# HELP sglang:page_size KV cache page size in tokens.
# TYPE sglang:page_size gauge
sglang:page_size{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 16.0
# HELP sglang:num_pages Number of KV cache pages.
# TYPE sglang:num_pages gauge
sglang:num_pages{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 256.0
# HELP sglang:num_retracted_requests_total Total number of retracted requests.
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{engine_type="unified",model_name="smol",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 4.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="smol",priority="2500000"} 1000.0
sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="smol",priority="1000000"} 200.0
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="smol",priority="2500000"} 300.0
sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="smol",priority="1000000"} 50.0
# HELP sglang:cached_tokens_total Number of cached prompt tokens by source (device/host/storage).
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="smol",priority="2500000"} 448.0
sglang:cached_tokens_total{cache_source="host",engine_type="unified",model_name="smol",priority="2500000"} 32.0
"""


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` on a free port, in its own thread and event loop; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the fake SGLang server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


@dataclass
class Setup:
    fake: FakeSglang
    frontend: ExternalFrontend
    client: httpx.AsyncClient


@pytest.fixture
async def sglang() -> AsyncIterator[Setup]:
    fake = FakeSglang(metrics_text=METRICS_TEXT)
    with serving(fake.app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as client:
            info = engine_model_info(MODEL, 2 * CONTEXT_LEN)  # wider than the engine's: SGLang checks too
            frontend = ExternalFrontend(SglangAdapter(), client, "w-sglang", info, max_num_seqs=4)
            yield Setup(fake, frontend, client)
            await frontend.close()
        paths = {path for _, path, _ in fake.requests}
        assert paths <= {"/health", "/v1/models", "/v1/tokenize", "/generate", "/metrics"}, paths
        for body in fake.bodies("/generate"):
            assert set(body) <= GENERATE_REQUEST_FIELDS, set(body) - GENERATE_REQUEST_FIELDS


async def run(
    setup: Setup, prompt: list[int], sampling: SamplingParams, *, priority: float = 0.0, tenant: str = "acme",
    request_id: str = "r1",
) -> list[RequestOutput]:  # fmt: skip
    frontend = setup.frontend
    lineage = Lineage(tenant=tenant, request_id=request_id)
    request = frontend.build_request(request_id, prompt, sampling, priority=priority, lineage=lineage)
    return [output async for output in frontend.run(request)]


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def spec(**changes: Any) -> LaunchSpec:
    values: dict[str, Any] = dict(
        python="/venv/bin/python", model_path="/models/smol", served_name=MODEL, host="127.0.0.1", port=30001,
        max_num_seqs=8, max_model_len=4096, kv_events_endpoint="tcp://127.0.0.1:5557", device="cuda",
    )  # fmt: skip
    return LaunchSpec(**(values | changes))


# -- launch ---------------------------------------------------------------------------------


def test_launch_command_passes_only_sglang_flags() -> None:
    argv = SglangAdapter().launch_command(spec())
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    flags = {arg for arg in argv if arg.startswith("--")}
    assert flags <= SGLANG_SERVER_FLAGS, flags - SGLANG_SERVER_FLAGS
    assert flag_value(argv, "--model-path") == "/models/smol"
    assert flag_value(argv, "--served-model-name") == MODEL
    assert (flag_value(argv, "--host"), flag_value(argv, "--port"), flag_value(argv, "--device")) == (
        "127.0.0.1", "30001", "cuda",
    )  # fmt: skip
    assert (flag_value(argv, "--max-running-requests"), flag_value(argv, "--context-length")) == ("8", "4096")
    assert flag_value(argv, "--page-size") == "16"  # our block: every SGLang page re-hashes
    assert {"--enable-priority-scheduling", "--enable-metrics"} <= flags
    assert "--schedule-low-priority-values-first" not in flags  # higher values first: our sign
    assert not flags & {"--enable-hierarchical-cache", "--enable-hicache", "--hicache-storage-backend"}
    events = json.loads(flag_value(argv, "--kv-events-config"))
    assert set(events) <= KV_EVENTS_CONFIG_FIELDS
    assert events == {"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "topic": "kv", "bind": False}


def test_launch_command_appends_operator_args_and_omits_what_is_unset() -> None:
    hicache = ("--enable-hierarchical-cache", "--hicache-storage-backend", "mooncake")
    argv = SglangAdapter().launch_command(spec(kv_events_endpoint="", max_model_len=None, extra_args=hicache))
    assert tuple(argv[-3:]) == hicache
    assert {arg for arg in argv if arg.startswith("--")} <= SGLANG_SERVER_FLAGS
    assert "--kv-events-config" not in argv and "--context-length" not in argv


# -- tokenize, models, health ---------------------------------------------------------------


async def test_tokenize_renders_chat_through_sglang_and_encodes_text(sglang: Setup) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert await sglang.frontend.encode(PromptInput(messages=messages)) == chat_ids(messages)
    assert await sglang.frontend.encode(PromptInput(text="hi")) == [BOS, *b"hi"]
    assert await sglang.frontend.encode(PromptInput(token_ids=[5, 6, 7])) == [5, 6, 7]  # no request
    assert sglang.fake.bodies("/v1/tokenize") == [
        {"model": MODEL, "messages": messages},
        {"model": MODEL, "prompt": "hi"},
    ]
    with pytest.raises(InvalidRequest):
        await sglang.frontend.encode(PromptInput())


async def test_max_model_len_and_health_come_from_sglang_routes(sglang: Setup) -> None:
    adapter = SglangAdapter()
    assert (await sglang.client.get(adapter.health_path)).status_code == 200
    served = (await sglang.client.get("/v1/models")).json()["data"][0]
    assert served["id"] == MODEL
    assert adapter.max_model_len(served) == CONTEXT_LEN
    assert adapter.max_model_len({"id": MODEL, "max_model_len": None}) is None


# -- generate -------------------------------------------------------------------------------

PROMPT = list(range(10, 50))  # 40 tokens: two full pages and a partial one


@pytest.mark.parametrize(
    ("stop", "max_tokens", "texts", "ids", "reason"),
    [
        ((), 10, ["Hel", "lo", " wor", "ld", "!", ""], list(SCRIPT), "stop"),  # EOS: an id, no text
        ((), 3, ["Hel", "lo", " wor"], [100, 101, 102], "length"),
        ((" world",), 10, ["Hel", "lo", "", ""], [100, 101, 102, 103], "stop"),  # " wor" held, then trimmed
        (
            ("word",),
            10,
            ["Hel", "lo", " ", "world", "!", ""],
            list(SCRIPT),
            "stop",
        ),  # "wor" held, then released
    ],
)
async def test_stream_is_incremental_and_ends_once(
    sglang: Setup, stop: tuple[str, ...], max_tokens: int, texts: list[str], ids: list[int], reason: str
) -> None:
    outputs = await run(sglang, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=stop))
    assert [o.new_text for o in outputs] == texts
    assert [t for o in outputs for t in o.new_token_ids] == ids
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    last = outputs[-1]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == (reason, len(PROMPT), len(ids))
    assert [o.completion_tokens for o in outputs] == list(range(1, len(ids) + 1))


async def test_request_body_maps_sampling_priority_and_tenant(sglang: Setup) -> None:
    sampling = SamplingParams(
        max_tokens=4, temperature=0.7, top_p=0.9, seed=11, stop=("\n",), min_tokens=2,
        frequency_penalty=0.5, presence_penalty=-0.25, repetition_penalty=1.1, logit_bias=((7, 5.0), (9, -100.0)),
    )  # fmt: skip
    await run(sglang, PROMPT, sampling, priority=2.5, request_id="urgent")
    await run(sglang, PROMPT, SamplingParams(max_tokens=2, ignore_eos=True), priority=0.5, request_id="later")
    urgent, later = sglang.fake.bodies("/generate")
    assert urgent == {
        "rid": "urgent", "input_ids": PROMPT, "stream": True, "priority": 2_500_000, "cache_salt": "acme",
        "session_id": "urgent",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0.7, "top_p": 0.9, "stop": ["\n"],
                            "ignore_eos": False, "min_new_tokens": 2, "sampling_seed": 11,
                            "frequency_penalty": 0.5, "presence_penalty": -0.25, "repetition_penalty": 1.1,
                            "logit_bias": {"7": 5.0, "9": -100.0}},
    }  # fmt: skip
    assert later["sampling_params"]["ignore_eos"] is True and "sampling_seed" not in later["sampling_params"]
    assert (
        "logit_bias" not in later["sampling_params"] and later["sampling_params"]["repetition_penalty"] == 1.0
    )
    assert urgent["priority"] > later["priority"] == 500_000  # SGLang serves higher values first


async def test_cached_tokens_are_reported_per_tenant(sglang: Setup) -> None:
    sampling = SamplingParams(max_tokens=2, temperature=0.0)
    first = await run(sglang, PROMPT, sampling, request_id="a")
    again = await run(sglang, PROMPT, sampling, request_id="b")
    other = await run(sglang, PROMPT, sampling, tenant="other", request_id="c")
    assert [o[-1].cached_tokens for o in (first, again, other)] == [0, 32, 0]


async def test_pre_prefill_is_one_token_at_the_lowest_priority(sglang: Setup) -> None:
    lineage = cachemgr_pb2.LineageSelector(tenant="acme", request_id="r9")
    directive = cachemgr_pb2.CacheDirective(
        kind=cachemgr_pb2.DIRECTIVE_KIND_PRE_PREFILL, lineage=lineage, token_ids=PROMPT
    )
    assert await sglang.frontend.apply_directives([directive]) == 1
    for _ in range(200):
        if sglang.fake.bodies("/generate"):
            break
        await asyncio.sleep(0.01)
    (body,) = sglang.fake.bodies("/generate")
    assert body["sampling_params"]["max_new_tokens"] == 1 and body["sampling_params"]["temperature"] == 0.0
    assert body["priority"] == integer_priority(PRE_PREFILL_PRIORITY, lower_first=False) == -(10**15)
    assert (body["input_ids"], body["cache_salt"]) == (PROMPT, "acme")


@pytest.mark.parametrize("kind", ["DROP", "RETAIN", "WRITE_BACK", "PROMOTE"])
async def test_directives_without_an_sglang_counterpart_are_refused(sglang: Setup, kind: str) -> None:
    directive = cachemgr_pb2.CacheDirective(kind=getattr(cachemgr_pb2, f"DIRECTIVE_KIND_{kind}"))
    with pytest.raises(DirectiveRejected) as info:
        await sglang.frontend.apply_directives([directive])
    assert info.value.missing_tier
    assert not sglang.fake.bodies("/generate")


# -- errors ---------------------------------------------------------------------------------


async def test_the_fake_refuses_unknown_sampling_fields_as_sglang_does(sglang: Setup) -> None:
    body = SglangAdapter().request_body(EngineCall("r", PROMPT, SamplingParams(max_tokens=1), 0.0, "acme"))
    assert (await sglang.client.post("/generate", json=body)).status_code == 200
    body["sampling_params"] = {"max_tokens": 1}  # the OpenAI name, not SGLang's max_new_tokens
    assert (await sglang.client.post("/generate", json=body)).status_code == 400


@pytest.mark.parametrize(
    ("status", "error"), [(400, InvalidRequest), (422, InvalidRequest), (503, Unavailable)]
)
async def test_engine_status_codes_map_to_our_errors(
    sglang: Setup, status: int, error: type[Exception]
) -> None:
    sglang.fake.fail_status = status
    with pytest.raises(error):
        await run(sglang, PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(error):
        await sglang.frontend.encode(PromptInput(text="hi"))


async def test_a_prompt_past_the_engine_window_is_invalid(sglang: Setup) -> None:
    with pytest.raises(InvalidRequest, match="longer than the model's context length"):
        await run(sglang, [7] * (CONTEXT_LEN + 1), SamplingParams(max_tokens=2))


@pytest.mark.parametrize(("status", "error"), [(400, InvalidRequest), (503, Unavailable)])
async def test_an_abort_with_a_status_code_is_an_error(
    sglang: Setup, status: int, error: type[Exception]
) -> None:
    sglang.fake.abort, sglang.fake.abort_status = True, status
    with pytest.raises(error):
        await run(sglang, PROMPT, SamplingParams(max_tokens=5))


async def test_an_abort_without_a_status_code_ends_the_request(sglang: Setup) -> None:
    sglang.fake.abort = True
    outputs = await run(sglang, PROMPT, SamplingParams(max_tokens=5))
    assert [o.new_token_ids for o in outputs] == [[100], [101]]
    assert (outputs[-1].finished, outputs[-1].finish_reason) == (True, "abort")


# -- stats ----------------------------------------------------------------------------------


async def test_stats_come_from_sglang_metrics(sglang: Setup) -> None:
    assert await sglang.frontend.refresh()
    stats = sglang.frontend.stats()
    assert (stats.running, stats.waiting) == (3, 2)  # the totals, not the per-priority series again
    assert (stats.kv_blocks_used, stats.kv_blocks_cached, stats.kv_blocks_total) == (100, 60, 256)
    assert stats.preemptions_total == 4
    assert (stats.prompt_tokens_total, stats.cached_prompt_tokens_total) == (1200, 480)
    assert stats.computed_prompt_tokens_total == 720
    assert (stats.generated_tokens_total, stats.hit_tokens, stats.max_num_seqs) == (350, (480, 0, 0), 4)
    assert sglang.frontend.engine_block_size == 16


async def test_stats_without_priority_series_count_once(sglang: Setup) -> None:
    sglang.fake.metrics_text = "\n".join(
        line.replace(',priority=""', "")
        for line in METRICS_TEXT.splitlines()
        if 'priority="' not in line or 'priority=""' in line
    )
    assert await sglang.frontend.refresh()
    assert (sglang.frontend.stats().running, sglang.frontend.stats().waiting) == (3, 2)


# -- a real SGLang server -------------------------------------------------------------------


def sglang_missing() -> str:
    """Why a real SGLang server cannot run here ("" when it can)."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    import torch

    return "" if torch.cuda.is_available() else "needs a CUDA device"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(bool(sglang_missing()), reason=sglang_missing() or "runs")
@pytest.mark.timeout(900)
async def test_a_real_sglang_server_streams_through_grpc_generate(nats_url: str, tmp_path: Path) -> None:
    from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
    from clairvoyant.core.grpcutil import channel
    from clairvoyant.worker.config import WorkerSettings
    from clairvoyant.worker.engines.app import ExternalWorkerApp

    port = free_port()
    settings = WorkerSettings(
        worker_id="w-sglang", engine="sglang", model=MODEL, device="cuda", nats_url=nats_url,
        engine_model=os.environ.get("CV_TEST_SGLANG_MODEL", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        worker_grpc_port=port, max_num_seqs=4, max_model_len=2048, engine_log=str(tmp_path / "sglang.log"),
    )  # fmt: skip
    app = ExternalWorkerApp(settings)
    await app.start()
    try:
        request = worker_pb2.GenerateRequest(
            request_id="g1",
            chat=worker_pb2.ChatMessages(
                messages=[common_pb2.ChatMessage(role="user", content="Say hello.")]
            ),
            sampling=common_pb2.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
            tenant="acme",
        )
        async with channel(f"127.0.0.1:{port}") as chan:
            replies = [r async for r in worker_pb2_grpc.WorkerStub(chan).Generate(request)]
        assert sum(len(r.token_ids) for r in replies) == 8
        assert replies[-1].finish_reason == "length" and replies[-1].usage.completion_tokens == 8
        assert all(not r.HasField("finish_reason") for r in replies[:-1])
        assert app.frontend.engine_block_size == 16
    finally:
        await app.stop()


async def test_logprobs_come_back_one_per_token_with_their_text(sglang: Setup) -> None:
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2)
    outputs = await run(sglang, PROMPT, sampling, request_id="lp")
    (body,) = sglang.fake.bodies("/generate")
    assert (body["return_logprob"], body["top_logprobs_num"], body["return_text_in_logprobs"]) == (
        True,
        2,
        True,
    )
    assert body["logprob_start_len"] == -1  # the output's only
    entries = [lp for out in outputs for lp in out.logprobs]
    ids = [t for out in outputs for t in out.new_token_ids]
    assert [lp.token_id for lp in entries] == ids and len(entries) == 4
    assert [lp.logprob for lp in entries] == [-0.5, -1.0, -1.5, -2.0]
    assert "".join(lp.text or "" for lp in entries) == "".join(out.new_text for out in outputs)
    assert all(len(lp.top) == 2 and lp.top[0] == (lp.token_id, lp.logprob) for lp in entries)
    await run(sglang, PROMPT, SamplingParams(max_tokens=2), request_id="plain")
    assert "return_logprob" not in sglang.fake.bodies("/generate")[1]
