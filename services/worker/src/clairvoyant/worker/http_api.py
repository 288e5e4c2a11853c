"""The worker's own OpenAI-compatible HTTP endpoint.

It exists so that third-party routers (sglang-router, vllm-router) can front the very same
workers as live baselines, bypassing our gateway and scheduler.  It answers the probes those
routers send (``/health``, ``/get_server_info``, ``/get_model_info`` and their newer names) and
the two OpenAI generation endpoints, streaming or not.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.worker.core.engine import RequestOutput
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.frontend import PromptInput, WorkerFrontend
from clairvoyant.worker.heartbeat import Heartbeat


class _Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class _GenerationBody(BaseModel):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)

    def sampling(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=tuple(stop),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
        )


class ChatBody(_GenerationBody):
    messages: list[_Message] = Field(min_length=1)


class CompletionBody(_GenerationBody):
    prompt: str | list[int]


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


async def _prepend(first: RequestOutput, rest: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    yield first
    async for item in rest:
        yield item


def create_app(service: WorkerFrontend, heartbeat: Heartbeat) -> FastAPI:
    app = FastAPI(title="Clairvoyant worker", docs_url=None, redoc_url=None)

    @app.exception_handler(ClairvoyantError)
    async def _clairvoyant_error(_: Request, err: ClairvoyantError) -> JSONResponse:
        return JSONResponse(err.to_openai(), status_code=err.http_status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"] if p != "body")
        return JSONResponse(InvalidRequest(f"{param}: {first['msg']}", param=param).to_openai(), status_code=400)

    def server_info() -> dict[str, Any]:
        stats = heartbeat.snapshot()
        return {
            "model_path": service.model_name,
            "served_model_name": service.model_name,
            "worker_id": service.worker_id,
            "max_total_num_tokens": stats.kv_blocks_total * stats.block_size,
            "max_running_requests": stats.max_batch,
            "context_length": service.max_model_len,
            "page_size": stats.block_size,
            "running": stats.running,
            "queued": stats.queued,
            "kv_blocks_used": stats.kv_blocks_used,
            "kv_blocks_cached": stats.kv_blocks_cached,
            "kv_blocks_total": stats.kv_blocks_total,
        }

    def model_info() -> dict[str, Any]:
        return {"model_path": service.model_name, "tokenizer_path": service.model_name, "is_generation": True}

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200)

    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, server_info, methods=["GET"])
    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, model_info, methods=["GET"])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": service.model_name, "object": "model", "owned_by": "clairvoyant", "max_model_len": service.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatBody) -> JSONResponse | StreamingResponse:
        prompt = PromptInput(messages=[m.model_dump() for m in body.messages])
        return await _generate(body, prompt, chat=True)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody) -> JSONResponse | StreamingResponse:
        prompt = PromptInput(text=body.prompt) if isinstance(body.prompt, str) else PromptInput(token_ids=body.prompt)
        return await _generate(body, prompt, chat=False)

    async def _generate(body: _GenerationBody, prompt: PromptInput, *, chat: bool) -> JSONResponse | StreamingResponse:
        if body.model and body.model != service.model_name:
            raise InvalidRequest(f"this worker serves {service.model_name!r}", param="model", code="model_not_found")
        ids = service.tokenize(prompt)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            sampling = body.sampling(service.default_max_tokens(len(ids)))
        except ValueError as exc:  # e.g. min_tokens > max_tokens
            raise InvalidRequest(str(exc)) from exc
        request = service.build_request(request_id, ids, sampling)
        outputs = service.run(request)
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
        assert last is not None and last.finished
        usage = {
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "total_tokens": last.prompt_tokens + last.completion_tokens,
        }
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        kind = "chat.completion" if chat else "text_completion"
        return JSONResponse(
            {"id": request_id, "object": kind, "created": created, "model": service.model_name,
             "choices": [choice], "usage": usage}
        )

    async def _stream(outputs: AsyncIterator[RequestOutput], request_id: str, created: int, chat: bool) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        async for out in outputs:
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": out.new_text}, "finish_reason": None}
            else:
                choice = {"index": 0, "text": out.new_text, "finish_reason": None}
            if out.finished:
                choice["finish_reason"] = out.finish_reason
            yield _sse({"id": request_id, "object": kind, "created": created, "model": service.model_name,
                        "choices": [choice]})
        yield _sse("[DONE]")

    return app
