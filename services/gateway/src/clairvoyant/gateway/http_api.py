"""The OpenAI-compatible HTTP edge (FastAPI): parse, authenticate, validate, then the pipeline.

Every failure leaves as an OpenAI error object; a client mistake is always a 4xx, never a 500.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import format_param
from clairvoyant.core.openai_output import ChatCompletionOut, ModelCard, ModelList, TextCompletionOut
from clairvoyant.core.openai_schema import ChatCompletionBody, CompletionBody, validate_body
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway import anthropic_api, openai_responses
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.metrics import RequestCounter
from clairvoyant.gateway.openai_api import to_request, with_tool_of_last_result
from clairvoyant.gateway.openapi_doc import add_body_schemas, error_responses, generated, json_body
from clairvoyant.gateway.ratelimit import RateLimited
from clairvoyant.gateway.request import Endpoint
from clairvoyant.gateway.responses import chat_completion, text_completion
from clairvoyant.gateway.sessions import derive_app_metadata
from clairvoyant.gateway.sse import chat_events, text_events

logger = logging.getLogger(__name__)
# /v1/models: a model group's owned_by (the scheduler picks a served model per call).
GROUP_OWNER = "clairvoyant-model-group"


def error_response(err: ClairvoyantError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None or err.http_status == 429:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s or 1)))
    if err.http_status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(err, RateLimited):
        headers.update(err.headers)
    return JSONResponse(err.to_openai(), status_code=err.http_status, headers=headers)


class GatewayAPI(FastAPI):
    """FastAPI, with the request bodies in /openapi.json: the handlers read them raw."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:  # built once, then cached by FastAPI
            add_body_schemas(super().openapi(), (ChatCompletionBody, CompletionBody))
        return super().openapi()


# FastAPI's own telemetry (from 0.165: a span per request and per dependency, metrics, logs) off:
# the gateway traces the request path itself and counts in Prometheus, and the extra spans cost
# about a third of a refusal's CPU in an overload burst.
_NO_FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def create_app(settings: GatewaySettings, frontend: GatewayFrontend) -> FastAPI:
    app = GatewayAPI(
        title="Clairvoyant gateway",
        summary="OpenAI-compatible API for agent workflows",
        **_NO_FRAMEWORK_TELEMETRY,
    )
    app.add_middleware(RequestCounter)
    limits = settings.input_limits()
    session_tagging = settings.session_tagging()

    @app.exception_handler(ClairvoyantError)
    async def on_error(request: Request, err: ClairvoyantError) -> Response:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        error = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = tuple(error.get("loc", ()))
        param = format_param(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
        return error_response(InvalidRequest(f"invalid {param}: {error.get('msg')}", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        body = {"error": {"message": str(exc.detail), "type": kind, "param": None, "code": None}}
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ClairvoyantError("internal error; see the gateway log"))

    async def generate(request: Request, endpoint: Endpoint) -> Response:
        arrival = frontend.pipeline.now()
        tenant = await frontend.auth.authenticate(request.headers.get("authorization"))
        raw = await read_json(request, settings.max_request_bytes, settings.max_json_depth)
        chat = endpoint == "chat.completions"
        body: ChatCompletionBody | CompletionBody = (
            validate_body(raw, ChatCompletionBody, limits)
            if chat
            else validate_body(raw, CompletionBody, limits)
        )
        req = to_request(
            body,
            tenant=tenant,
            endpoint=endpoint,
            request_id=uuid.uuid4().hex,
            arrival_time=arrival,
            max_tokens_limit=settings.max_tokens_limit,
        )
        if req.app_metadata is None:  # Claude Code and agent frameworks tag sessions in headers only
            derived = derive_app_metadata(request.headers, req.chat, session_tagging)
            req = dataclasses.replace(req, app_metadata=with_tool_of_last_result(derived, req.chat))
        parent = extract_context(request.headers.items())  # a client's W3C traceparent, if it sent one
        # Busy (a full queue, a rate limit) is refused here, before the pipeline spends anything.
        headers = {"X-Request-Id": req.request_id, **frontend.admit(request.headers.get("authorization"), req)}
        if not req.stream:
            result = await until_disconnected(request, frontend.pipeline.complete(req, parent))
            if result is None:
                return Response(status_code=CLIENT_CLOSED)
            shape = (
                chat_completion(result, req.echo_annotations)
                if chat
                else text_completion(result, req.echo_annotations)
            )
            return Response(shape.model_dump_json(), media_type="application/json", headers=headers)
        generation = await frontend.pipeline.start(req, parent)
        events = (chat_events if chat else text_events)(generation, body.include_usage())
        # The background close also covers a client gone before the body iterator ever started.
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={**headers, **SSE_HEADERS},
            background=BackgroundTask(generation.close),
        )

    refusals = error_responses(400, 401, 404, 413, 429, 500, 503)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=json_body(ChatCompletionBody),
        responses={**generated(ChatCompletionOut), **refusals},
    )
    async def chat_completions(request: Request) -> Response:
        return await generate(request, "chat.completions")

    @app.post(
        "/v1/completions",
        openapi_extra=json_body(CompletionBody),
        responses={**generated(TextCompletionOut), **refusals},
    )
    async def completions(request: Request) -> Response:
        try:
            return await generate(request, "completions")
        except InvalidRequest as err:
            if err.param == "messages":  # the worker calls any prompt "messages"
                err.param = "prompt"
            raise

    @app.post("/v1/messages", openapi_extra=anthropic_api.body_doc(), responses=anthropic_api.responses())
    async def messages(request: Request) -> Response:
        return await anthropic_api.create_message(request, frontend)

    openai_responses.register(app, settings, frontend)

    @app.get("/v1/models", responses={200: {"model": ModelList}, **error_responses(401, 500, 503)})
    async def list_models(request: Request) -> Response:
        await frontend.auth.authenticate(request.headers.get("authorization"))
        models = await frontend.models.models()
        groups = await frontend.models.groups()
        cards = [
            ModelCard(id=m.name, created=frontend.started_at, max_model_len=m.max_model_len or None)
            for m in models.values()
        ] + [
            ModelCard(
                id=g.name, created=frontend.started_at, owned_by=GROUP_OWNER, max_model_len=g.max_model_len or None
            )
            for g in groups.values()
        ]
        return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        ready, reason = await frontend.readiness()
        body = {"status": "ready" if ready else "unavailable", "reason": reason}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app
