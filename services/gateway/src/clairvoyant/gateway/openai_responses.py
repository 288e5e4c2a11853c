"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``
(docs/responses-api.md): the routes.

Shapes follow OpenAI's API reference (the ``openai`` package's ``types/responses``).  The body is
held to ``PARAMETERS`` as the chat route holds its body to ``openai_parameters``: a refused
parameter is a 400 naming it unless its value asks for nothing, an unknown one is a 400 unless
``CV_GATEWAY_LENIENT_PARAMETERS``.  ``input`` holds text messages, ``function_call`` and
``function_call_output`` items; any other item, content part or tool type is a 400 naming where
it sits.  Errors leave in OpenAI's error shape, or as an ``error`` event once a stream has begun.

Choices where the reference leaves room: a function tool without ``strict`` is strict (OpenAI's
default here); a ``previous_response_id`` that is unknown, expired, deleted or another tenant's is
a 404 ``previous_response_not_found`` (the same answer for each, so ids do not leak across
tenants); a response cut by ``max_output_tokens`` ends its stream with ``response.incomplete``,
as OpenAI's does.  ``store`` defaults to true; with it, a store that cannot be reached is a 503
before anything is generated, and a failed write a 503 (or an ``error`` event) after.

The request is ``responses_request`` (and ``responses_input``), the response's shapes
``responses_output``, its events ``responses_stream``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.generation import Generation
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.openapi_doc import error_responses
from clairvoyant.gateway.request import GenerationRequest
from clairvoyant.gateway.response_store import ResponseStore, StoredResponse
from clairvoyant.gateway.responses_input import invalid
from clairvoyant.gateway.responses_output import (
    ResponseOut,
    assistant_turn,
    finished,
    output_of,
    response_id,
    response_shell,
)
from clairvoyant.gateway.responses_request import ParsedRequest, ResponsesBody, to_request, validate_body
from clairvoyant.gateway.responses_stream import StreamedOutput
from clairvoyant.gateway.sessions import derive_conversation_metadata

logger = logging.getLogger(__name__)


# ---- the routes ---------------------------------------------------------------------------------


class ResponseNotFound(ClairvoyantError):
    http_status = 404
    error_type = "invalid_request_error"  # what OpenAI answers for an unknown response id
    default_code = "response_not_found"


class Conversation(NamedTuple):
    """What a stored chain gives the next request."""

    conversation_id: str | None  # the chain's first response id; None: nothing to continue
    depth: int  # responses in the chain before this one
    turns: tuple[ChatTurn, ...]


class ResponsesRoutes:
    """The routes' handlers, over one store."""

    def __init__(self, settings: GatewaySettings, frontend: GatewayFrontend, store: ResponseStore) -> None:
        self.settings = settings
        self.frontend = frontend
        self.store = store

    async def create(self, request: Request) -> Response:
        settings, frontend = self.settings, self.frontend
        arrival = frontend.pipeline.now()
        authorization = request.headers.get("authorization")
        tenant = await frontend.auth.authenticate(authorization)
        raw = await read_json(request, settings.max_request_bytes, settings.max_json_depth)
        parsed = validate_body(raw, settings.input_limits())
        conversation = await self._conversation(tenant, parsed)
        req = to_request(
            parsed,
            conversation.turns,
            tenant=tenant,
            request_id=uuid.uuid4().hex,
            arrival_time=arrival,
            max_tokens_limit=settings.max_tokens_limit,
        )
        if req.app_metadata is None:
            # A stored response can start a chain: it is its own conversation's first response.
            chain = conversation.conversation_id or (response_id(req.request_id) if parsed.stores else None)
            derived = derive_conversation_metadata(
                request.headers, req.chat, settings.session_tagging(), chain
            )
            req = dataclasses.replace(req, app_metadata=derived)
        parent = extract_context(request.headers.items())
        headers = {"X-Request-Id": req.request_id, **frontend.admit(authorization, req)}
        shell = response_shell(parsed, req)
        if not req.stream:
            result = await until_disconnected(request, frontend.pipeline.complete(req, parent))
            if result is None:
                return Response(status_code=CLIENT_CLOSED)
            response = finished(shell, output_of(result), result.finish_reason, result.usage)
            await self._save(parsed, conversation, req, response)
            return Response(response.model_dump_json(), media_type="application/json", headers=headers)
        generation = await frontend.pipeline.start(req, parent)
        return StreamingResponse(
            self._events(generation, shell, parsed, conversation),
            media_type="text/event-stream",
            headers={**headers, **SSE_HEADERS},
            background=BackgroundTask(generation.close),
        )

    async def retrieve(self, request: Request, response_id: str) -> Response:
        tenant = await self.frontend.auth.authenticate(request.headers.get("authorization"))
        stored = await self.store.load(tenant, response_id)
        if stored is None:
            raise ResponseNotFound(f"Response with id {response_id!r} not found.", param="response_id")
        return Response(json.dumps(stored.response), media_type="application/json")

    async def delete(self, request: Request, response_id: str) -> Response:
        tenant = await self.frontend.auth.authenticate(request.headers.get("authorization"))
        if not await self.store.delete(tenant, response_id):
            raise ResponseNotFound(f"Response with id {response_id!r} not found.", param="response_id")
        body = {"id": response_id, "object": "response", "deleted": True}
        return Response(json.dumps(body), media_type="application/json")

    async def _conversation(self, tenant: str, parsed: ParsedRequest) -> Conversation:
        """The stored chain ``previous_response_id`` continues (404 when there is none for this
        tenant; 400 when it is already ``CV_GATEWAY_RESPONSES_MAX_CHAIN`` long).  With nothing to
        continue, a request that will be stored first proves the store answers: a 503 now costs
        no generation."""
        previous_id = parsed.body.previous_response_id
        if previous_id is None:
            if parsed.stores:
                await self.store.check()
            return Conversation(None, 0, ())
        previous = await self.store.load(tenant, previous_id)
        if previous is None:
            raise ResponseNotFound(
                f"Previous response with id {previous_id!r} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        most = self.settings.gateway_responses_max_chain
        if previous.depth >= most:
            raise invalid(
                "previous_response_id",
                f"continues a chain of {previous.depth} responses; at most {most} are kept in one chain",
                "conversation_too_long",
            )
        return Conversation(previous.conversation_id, previous.depth, previous.turns)

    async def _save(
        self, parsed: ParsedRequest, conversation: Conversation, req: GenerationRequest, response: ResponseOut
    ) -> None:
        if not parsed.stores:
            return
        turns = (*conversation.turns, *parsed.turns, assistant_turn(response.output))
        await self.store.save(
            StoredResponse(
                id=response.id,
                tenant=req.tenant,
                created_at=req.arrival_time,
                conversation_id=conversation.conversation_id or response.id,
                depth=conversation.depth + 1,
                turns=turns,
                response=response.model_dump(mode="json"),
            )
        )

    async def _events(
        self, generation: Generation, shell: ResponseOut, parsed: ParsedRequest, conversation: Conversation
    ) -> AsyncIterator[bytes]:
        """response.created and .in_progress, each item's events, then response.completed (or
        .incomplete); an ``error`` event ends the stream when the generation or the store fails."""
        stream = StreamedOutput(generation.request.request_id)
        try:
            yield stream.event("response.created", response=shell.model_dump(mode="json"))
            yield stream.event("response.in_progress", response=shell.model_dump(mode="json"))
            async for piece in generation.chunks():
                if piece.choice != 0:  # n is always 1 here
                    continue
                for chunk in stream.text(piece.text) if piece.text else ():
                    yield chunk
                for delta in piece.tool_calls:
                    for chunk in stream.call(delta):
                        yield chunk
            assert generation.finish_reason is not None, "chunks() ends only once the worker finished"
            for chunk in stream.finish(generation.finish_reason):
                yield chunk
            response = finished(shell, stream.items, generation.finish_reason, generation.usage)
            await self._save(parsed, conversation, generation.request, response)
            kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
            yield stream.event(kind, response=response.model_dump(mode="json"))
        except ClairvoyantError as err:
            yield stream.event("error", code=err.code, message=err.message, param=err.param)
        finally:
            await generation.close()


def register(app: FastAPI, settings: GatewaySettings, frontend: GatewayFrontend) -> None:
    """Add the Responses API's routes to ``app``; the store is the frontend's (``frontend.responses``)."""
    store = frontend.responses
    app.state.response_store = store
    routes = ResponsesRoutes(settings, frontend, store)
    refusals = error_responses(400, 401, 404, 413, 429, 500, 503)
    body = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ResponsesBody.model_json_schema()}},
        }
    }
    app.add_api_route(
        "/v1/responses",
        routes.create,
        methods=["POST"],
        responses={200: {"model": ResponseOut, "description": "The response, or its events"}, **refusals},
        openapi_extra=body,
    )
    app.add_api_route("/v1/responses/{response_id}", routes.retrieve, methods=["GET"], responses=refusals)
    app.add_api_route("/v1/responses/{response_id}", routes.delete, methods=["DELETE"], responses=refusals)
