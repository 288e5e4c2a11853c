"""The worker's own OpenAI-compatible HTTP endpoint.

It exists so that third-party routers (sglang-router, vllm-router) can front the very same
workers as live baselines, bypassing our gateway and scheduler.  It answers the probes those
routers send (``/health``, ``/get_server_info``, ``/get_model_info`` and their newer names) and
the two OpenAI generation endpoints, streaming or not, validated by the same schema as the
gateway's (``clairvoyant.core.openai_schema``): a bad body is a 400 naming the parameter.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import decode_json
from clairvoyant.core.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatChunkOut,
    ChatCompletionBody,
    ChatCompletionOut,
    ChatDelta,
    CompletionBody,
    GenerationBody,
    InputLimits,
    ModelCard,
    ModelList,
    TextChoice,
    TextCompletionOut,
    UsageOut,
    validate_body,
)
from clairvoyant.worker.core.engine import RequestOutput
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.frontend import PromptInput, WorkerFrontend
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.tools import chat_turn

MAX_JSON_DEPTH = 64  # the gateway's default CV_MAX_JSON_DEPTH
# Routers in front of a worker (sglang-router) re-encode requests with fields of their own
# (no_stop_trim, skip_special_tokens, ...): unknown fields are dropped, unsupported ones refused.
LIMITS = InputLimits(lenient_parameters=True)


def sampling_params(body: GenerationBody, default_max_tokens: int) -> SamplingParams:
    """The body's sampling settings; what it leaves unset takes the worker's defaults."""
    max_tokens, min_tokens = body.token_counts()
    return SamplingParams(
        max_tokens=max_tokens or default_max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        stop=tuple(body.stop or ()),
        ignore_eos=bool(body.ignore_eos),
        min_tokens=min_tokens,
        frequency_penalty=body.frequency_penalty or 0.0,
        presence_penalty=body.presence_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=body.logit_biases(),
    )


def _sse(payload: BaseModel | str) -> bytes:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return f"data: {data}\n\n".encode()


async def _prepend(first: RequestOutput, rest: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    yield first
    async for item in rest:
        yield item


def create_app(frontend: WorkerFrontend, heartbeat: Heartbeat) -> FastAPI:
    app = FastAPI(title="Clairvoyant worker", docs_url=None, redoc_url=None)
    started_at = int(time.time())

    @app.exception_handler(ClairvoyantError)
    async def _clairvoyant_error(_: Request, err: ClairvoyantError) -> JSONResponse:
        return JSONResponse(err.to_openai(), status_code=err.http_status)

    def server_info() -> dict[str, Any]:
        stats = heartbeat.snapshot()
        return {
            "model_path": frontend.model_name,
            "served_model_name": frontend.model_name,
            "worker_id": frontend.worker_id,
            "max_total_num_tokens": stats.kv_blocks_total * stats.block_size,
            "max_running_requests": stats.max_batch,
            "context_length": frontend.max_model_len,
            "page_size": stats.block_size,
            "running": stats.running,
            "queued": stats.queued,
            "kv_blocks_used": stats.kv_blocks_used,
            "kv_blocks_cached": stats.kv_blocks_cached,
            "kv_blocks_total": stats.kv_blocks_total,
        }

    def model_info() -> dict[str, Any]:
        return {"model_path": frontend.model_name, "tokenizer_path": frontend.model_name, "is_generation": True}

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, server_info, methods=["GET"])
    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, model_info, methods=["GET"])

    @app.get("/v1/models")
    async def models() -> Response:
        card = ModelCard(id=frontend.model_name, created=started_at, max_model_len=frontend.max_model_len)
        return Response(ModelList(data=[card]).model_dump_json(), media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        body = validate_body(decode_json(await request.body(), MAX_JSON_DEPTH), ChatCompletionBody, LIMITS)
        turns = body.turns()
        tools = [tool.spec().openai() for tool in body.tools or ()]
        prompt = PromptInput(
            messages=[chat_turn(turn.role, turn.content, turn.tool_calls, turn.tool_call_id) for turn in turns],
            tools=tools or None,  # rendered as the template does; tool_choice "none" is all that is served
        )
        return await _generate(body, prompt, chat=True)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        body = validate_body(decode_json(await request.body(), MAX_JSON_DEPTH), CompletionBody, LIMITS)
        return await _generate(body, PromptInput(text=body.prompt), chat=False)

    async def _generate(body: GenerationBody, prompt: PromptInput, *, chat: bool) -> Response:
        if heartbeat.draining:
            raise frontend.draining_error()
        if body.model != frontend.model_name:
            raise InvalidRequest(f"this worker serves {frontend.model_name!r}", param="model", code="model_not_found")
        if body.requested_logprobs() is not None:
            raise InvalidRequest(
                "logprobs are served through the gateway, not a worker's own endpoint",
                param="logprobs", code="unsupported_parameter",
            )  # fmt: skip
        for param in body.structured_params():  # several choices, tool calls, output constraints
            raise InvalidRequest(
                f"{param} is served through the gateway, not a worker's own endpoint",
                param=param, code="unsupported_parameter",
            )  # fmt: skip
        ids = await frontend.encode(prompt)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            sampling = sampling_params(body, frontend.default_max_tokens(len(ids)))
        except ValueError as exc:  # e.g. min_tokens past the default max_tokens
            raise InvalidRequest(str(exc)) from exc
        request = frontend.build_request(request_id, ids, sampling)
        outputs = frontend.run(request)
        try:  # admission errors surface with the first output, before any byte is sent
            first = await anext(outputs)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="messages") from exc
        created = int(time.time())
        if body.stream:
            return StreamingResponse(
                _stream(_prepend(first, outputs), request_id, created, chat), media_type="text/event-stream"
            )
        text, last = [], None
        async for out in _prepend(first, outputs):
            text.append(out.new_text)
            last = out
        assert last is not None and last.finished and last.finish_reason is not None
        usage = UsageOut.of(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
        content = "".join(text)
        shape: BaseModel = (
            ChatCompletionOut(
                id=request_id,
                created=created,
                model=frontend.model_name,
                choices=[ChatChoice(message=AssistantMessage(content=content), finish_reason=last.finish_reason)],
                usage=usage,
            )
            if chat
            else TextCompletionOut(
                id=request_id,
                created=created,
                model=frontend.model_name,
                choices=[TextChoice(text=content, finish_reason=last.finish_reason)],
                usage=usage,
            )
        )
        return Response(shape.model_dump_json(), media_type="application/json")

    async def _stream(
        outputs: AsyncIterator[RequestOutput], request_id: str, created: int, chat: bool
    ) -> AsyncIterator[bytes]:
        async for out in outputs:
            finish_reason = out.finish_reason if out.finished else None
            chunk: BaseModel = (
                ChatChunkOut(
                    id=request_id,
                    created=created,
                    model=frontend.model_name,
                    choices=[ChatChunkChoice(delta=ChatDelta(content=out.new_text), finish_reason=finish_reason)],
                )
                if chat
                else TextCompletionOut(
                    id=request_id,
                    created=created,
                    model=frontend.model_name,
                    choices=[TextChoice(text=out.new_text, finish_reason=finish_reason)],
                )
            )
            yield _sse(chunk)
        yield _sse("[DONE]")

    return app
