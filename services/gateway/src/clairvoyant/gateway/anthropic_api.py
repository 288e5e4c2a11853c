"""Anthropic's Messages API (``POST /v1/messages``) on the gateway: text and client tools.

The body is held to ``PARAMETERS`` as the OpenAI edge holds its bodies to ``openai_parameters``:
a refused parameter (``top_k``, ``thinking``, ...) is a 400 naming it unless its value asks for
nothing, an unknown one is a 400 unless ``CV_GATEWAY_LENIENT_PARAMETERS``.  Tools follow
Anthropic's API reference: client tools only (a server tool is a 400 naming it), ``tool_use``
blocks in assistant messages, ``tool_result`` blocks in user messages, paired as Anthropic pairs
them; an answer's calls come back as ``tool_use`` blocks, streamed as ``input_json_delta``s.
Content blocks other than text, tool_use and tool_result (images, documents, thinking) are a 400.
Every refusal and failure leaves in Anthropic's error shape (``{"type": "error", "error": {"type",
"message"}}``), in the body, or as an ``error`` event once a stream has begun.
docs/anthropic-api.md has the table.  This module holds the route, its session tagging and its
/openapi.json entry; ``anthropic_request``, ``anthropic_response`` and ``anthropic_stream`` the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from clairvoyant.core.app_metadata import ID_PATTERN, AppMetadata
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import decode_json
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.anthropic_request import MessagesBody, to_request, validate_body, with_last_tool
from clairvoyant.gateway.anthropic_response import AnthropicErrorOut, MessageOut, error_response, message_out
from clairvoyant.gateway.anthropic_stream import message_events
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.openapi_doc import ERRORS, Responses
from clairvoyant.gateway.sessions import SessionTagging, derive_app_metadata

logger = logging.getLogger(__name__)


# ---- sessions -----------------------------------------------------------------------------------


def claude_code_session(user_id: str | None) -> str | None:
    """The session id Claude Code puts in ``metadata.user_id``, or None for any other user id.

    Two forms: ``{"device_id": ..., "account_uuid": ..., "session_id": "<uuid>"}`` as a JSON string
    (from v2.1.78), and ``user_<hash>_account_<uuid>_session_<uuid>`` before it.  A session that is
    not a valid id counts as absent: user_id is the client's own opaque field, not a tag."""
    if not user_id:
        return None
    if user_id.startswith("{"):
        try:
            fields = decode_json(user_id.encode(), max_depth=1)
        except InvalidRequest:
            return None
        session = fields.get("session_id") if isinstance(fields, dict) else None
    else:
        _, marker, session = user_id.rpartition("_session_")
        session = session if marker else None
    return session if isinstance(session, str) and ID_PATTERN.match(session) else None


def derive_session(
    headers: Mapping[str, str], chat: Sequence[ChatTurn], tagging: SessionTagging, user_id: str | None
) -> AppMetadata | None:
    """``app_metadata`` for an untagged request: from the session headers (``derive_app_metadata``),
    else from the Claude Code session in ``metadata.user_id``; None when neither names one, or when
    the operator turned session tagging off.  A user id without a session names a person, not a
    workflow: every call of theirs would otherwise become one endless workflow."""
    derived = derive_app_metadata(headers, chat, tagging)
    session = claude_code_session(user_id)
    if derived is not None or session is None or not tagging.headers:
        return derived
    # The session stands in for the first session header: the same workflow type and agent rules.
    return derive_app_metadata({**headers, tagging.headers[0]: session}, chat, tagging)


# ---- the route ----------------------------------------------------------------------------------


def authorization(headers: Mapping[str, str]) -> str | None:
    """The Authorization value the key store reads: ``x-api-key`` as a bearer token, else the
    client's own ``Authorization`` header."""
    api_key = (headers.get("x-api-key") or "").strip()
    return f"Bearer {api_key}" if api_key else headers.get("authorization")


async def create_message(request: Request, frontend: GatewayFrontend) -> Response:
    """``POST /v1/messages``."""
    try:
        return await _create_message(request, frontend)
    except ClairvoyantError as err:
        return error_response(err)
    except Exception:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(ClairvoyantError("internal error; see the gateway log"))


async def _create_message(request: Request, frontend: GatewayFrontend) -> Response:
    settings = frontend.settings
    arrival = frontend.pipeline.now()
    auth = authorization(request.headers)
    tenant = await frontend.auth.authenticate(auth)
    raw = await read_json(request, settings.max_request_bytes, settings.max_json_depth)
    body = validate_body(raw, settings.input_limits())
    req = to_request(
        body,
        tenant=tenant,
        request_id=uuid.uuid4().hex,
        arrival_time=arrival,
        max_tokens_limit=settings.max_tokens_limit,
    )
    if req.app_metadata is None:
        user_id = body.metadata.user_id if body.metadata is not None else None
        derived = derive_session(request.headers, req.chat or (), settings.session_tagging(), user_id)
        req = dataclasses.replace(req, app_metadata=derived)
    req = dataclasses.replace(req, app_metadata=with_last_tool(req.app_metadata, req.chat or ()))
    parent = extract_context(request.headers.items())
    headers = {"X-Request-Id": req.request_id, **frontend.admit(auth, req)}
    if not req.stream:
        result = await until_disconnected(request, frontend.pipeline.complete(req, parent))
        if result is None:
            return Response(status_code=CLIENT_CLOSED)
        return Response(message_out(result).model_dump_json(), media_type="application/json", headers=headers)
    generation = await frontend.pipeline.start(req, parent)
    return StreamingResponse(
        message_events(generation),
        media_type="text/event-stream",
        headers={**headers, **SSE_HEADERS},
        background=BackgroundTask(generation.close),
    )


# ---- /openapi.json ------------------------------------------------------------------------------


def _inline(node: object, definitions: Mapping[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            return _inline(definitions[ref.rsplit("/", 1)[-1]], definitions)
        return {key: _inline(value, definitions) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    return node


def body_doc() -> dict[str, Any]:
    """``openapi_extra=`` for the route: the body's schema written out in place (the document's
    components hold only the OpenAI bodies), admitting no other top-level field."""
    schema = MessagesBody.model_json_schema()
    definitions = schema.pop("$defs", {})
    body = _inline({**schema, "additionalProperties": False}, definitions)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


def responses() -> Responses:
    """``responses=`` for the route: the message, or its events, and Anthropic's error object."""
    events = {"schema": {"type": "string", "description": "event: <type> and data: <event JSON> pairs"}}
    errors = {**ERRORS, 400: "Invalid request: a parameter, the JSON, its encoding, or an input limit"}
    return {
        200: {"model": MessageOut, "content": {"text/event-stream": events}, "description": "The answer"},
        **{
            status: {"model": AnthropicErrorOut, "description": errors[status]}
            for status in (400, 401, 404, 413, 429, 500, 503)
        },
    }
