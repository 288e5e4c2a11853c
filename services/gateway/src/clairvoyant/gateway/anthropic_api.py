"""Anthropic's Messages API (``POST /v1/messages``) on the gateway, text only.

The body is held to ``PARAMETERS`` as the OpenAI edge holds its bodies to ``openai_parameters``:
a refused parameter (``tools``, ``top_k``, ...) is a 400 naming it unless its value asks for
nothing, an unknown one is a 400 unless ``CV_GATEWAY_LENIENT_PARAMETERS``.  Content is text
blocks only: a ``tool_use`` or ``tool_result`` block is a 400 naming where it sits.  Every refusal
and failure leaves in Anthropic's error shape (``{"type": "error", "error": {"type", "message"}}``),
in the body, or as an ``error`` event once a stream has begun.  docs/openai-api.md has the table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator
from starlette.background import BackgroundTask

from clairvoyant.core.app_metadata import ID_PATTERN, AppMetadata, parse_app_metadata
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import check_strings, decode_json
from clairvoyant.core.openai_parameters import Status, asks_for_nothing, check_fields
from clairvoyant.core.openai_schema import APP_METADATA_SCHEMA, ChatTurn, InputLimits, invalid_request
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.generation import Generation
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.openapi_doc import ERRORS, Responses
from clairvoyant.gateway.ratelimit import RateLimited
from clairvoyant.gateway.request import CompletionResult, Endpoint, GenerationRequest, Sampling, TokenUsage
from clairvoyant.gateway.sessions import SessionTagging, derive_app_metadata

logger = logging.getLogger(__name__)

# CompletionRecord.endpoint and the metrics label of these calls (the worker serves them as chats).
ENDPOINT: Endpoint = "messages"
BLOCK_SEPARATOR = "\n"  # between the text blocks of one turn, and between merged turns
TOOL_BLOCKS = ("tool_use", "tool_result")

# ---- parameters ---------------------------------------------------------------------------------

class MessagesParameter(NamedTuple):
    name: str
    status: Status
    passes: tuple[object, ...] = ()  # refused only: values (besides null) that ask for nothing

    def asks_for_nothing(self, value: object) -> bool:
        return asks_for_nothing(value, self.passes)


PARAMETERS: tuple[MessagesParameter, ...] = (
    MessagesParameter("model", "supported"),
    MessagesParameter("messages", "supported"),
    MessagesParameter("max_tokens", "supported"),
    MessagesParameter("system", "supported"),
    MessagesParameter("stop_sequences", "supported"),
    MessagesParameter("stream", "supported"),
    MessagesParameter("temperature", "supported"),
    MessagesParameter("top_p", "supported"),
    MessagesParameter("metadata", "supported"),  # user_id may name the session
    MessagesParameter("app_metadata", "extension"),
    # One tier and one place: the scheduler's policy orders requests, not the client.
    MessagesParameter("service_tier", "ignored"),
    MessagesParameter("inference_geo", "ignored"),
    MessagesParameter("speed", "ignored"),
    # A caching hint: the prefix cache keys on the prompt and the workflow, whatever it says.
    MessagesParameter("cache_control", "ignored"),
    MessagesParameter("top_k", "refused"),  # the engine samples with temperature and top_p only
    MessagesParameter("tools", "refused", ([],)),
    MessagesParameter("tool_choice", "refused", ({"type": "none"}, {"type": "auto"})),
    # Asked-for thinking promises thinking blocks, which the engine never produces.
    MessagesParameter("thinking", "refused", ({"type": "disabled"},)),
    MessagesParameter("output_config", "refused", ({},)),
    MessagesParameter("container", "refused"),
    MessagesParameter("diagnostics", "refused"),
)
_BY_NAME = {p.name: p for p in PARAMETERS}


def check_parameters(body: Mapping[str, object], *, lenient: bool) -> None:
    """Raise InvalidRequest for the first field of ``body`` that is refused (with a value that asks
    for something) or, unless ``lenient``, unknown (``openai_parameters.check_fields``)."""
    check_fields(body, _BY_NAME, lenient=lenient)


# ---- the request --------------------------------------------------------------------------------

_TEXT_BLOCK = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
CONTENT_SCHEMA = WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]})
SYSTEM_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]}
)


class _Strict(BaseModel):
    # As the OpenAI bodies: "0.5" is not a number; fields check_parameters let through are dropped.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class MessageIn(_Strict):
    role: Literal["user", "assistant", "system"]  # a system message mid-conversation, as the SDK types allow
    content: Annotated[Any, CONTENT_SCHEMA] = Field()  # a string or text blocks (``text_of``)


class MetadataIn(_Strict):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = None


class MessagesBody(_Strict):
    model: str = Field(min_length=1)
    messages: list[MessageIn] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: Annotated[Any, SYSTEM_SCHEMA] = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    metadata: MetadataIn | None = None
    app_metadata: Annotated[Any, APP_METADATA_SCHEMA] = None  # validated by parse_app_metadata

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(value):
            raise ValueError("stop sequences must not be empty")
        return value

    def turns(self) -> tuple[ChatTurn, ...]:
        """The system prompt (when not empty) and the messages as chat turns.  Consecutive turns of
        one role merge into one, as Anthropic's API combines them.  InvalidRequest for a block that
        is not text, and for a final assistant turn: Anthropic continues it (prefill), while the
        worker's chat template would start a new turn after it."""
        turns: list[ChatTurn] = []
        system = text_of(self.system, "system") if self.system is not None else ""
        if system:
            turns.append(ChatTurn("system", system))
        for i, message in enumerate(self.messages):
            text = text_of(message.content, f"messages[{i}].content")
            if turns and turns[-1].role == message.role:
                turns[-1] = ChatTurn(message.role, turns[-1].content + BLOCK_SEPARATOR + text)
            else:
                turns.append(ChatTurn(message.role, text))
        if turns[-1].role == "assistant":
            param = f"messages[{len(self.messages) - 1}]"
            raise InvalidRequest(
                f"{param}: a final assistant message (prefill) is not supported; end with a user message",
                param=param,
                code="unsupported_prefill",
            )
        return tuple(turns)


def text_of(content: object, param: str) -> str:
    """A string, or the text of a list of ``{"type": "text", "text": ...}`` blocks (other keys, such
    as ``cache_control``, are ignored).  InvalidRequest naming the first block that is not text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{param} must be a string or a list of text blocks", param=param, code="invalid_type"
        )
    texts = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in TOOL_BLOCKS:
            raise InvalidRequest(
                f"{where} is a {kind!r} block: tool calling is not supported here",
                param=where,
                code="unsupported_content",
            )
        if kind != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(
                f"{where} must be {{'type': 'text', 'text': <string>}}; only text blocks are supported, got {kind!r}",
                param=where,
                code="unsupported_content",
            )
        texts.append(block["text"])
    return BLOCK_SEPARATOR.join(texts)


def validate_body(raw: object, limits: InputLimits) -> MessagesBody:
    """The decoded JSON body, validated.  Raises InvalidRequest naming the first offending parameter."""
    check_strings(raw, limits.max_string_chars)
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_body")
    check_parameters(raw, lenient=limits.lenient_parameters)
    for param, most in (("messages", limits.max_messages), ("stop_sequences", limits.max_stop_sequences)):
        items = raw.get(param)
        if isinstance(items, list) and len(items) > most:
            raise InvalidRequest(
                f"{param} has {len(items)} items; at most {most} are allowed",
                param=param,
                code="array_above_max_length",
            )
    try:
        return MessagesBody.model_validate(raw)
    except ValidationError as exc:
        raise invalid_request(exc) from None


def to_request(
    body: MessagesBody, *, tenant: str, request_id: str, arrival_time: float, max_tokens_limit: int
) -> GenerationRequest:
    if body.max_tokens > max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens must be at most {max_tokens_limit}", param="max_tokens", code="invalid_value"
        )
    return GenerationRequest(
        request_id=request_id,
        tenant=tenant,
        endpoint=ENDPOINT,
        model=body.model,
        sampling=Sampling(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            stop=tuple(body.stop_sequences or ()),
        ),
        arrival_time=arrival_time,
        chat=body.turns(),
        app_metadata=parse_app_metadata(body.app_metadata) if body.app_metadata is not None else None,
        stream=bool(body.stream),
    )


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


# ---- the response -------------------------------------------------------------------------------


class TextBlockOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class MessageUsage(BaseModel):
    input_tokens: int  # the prompt's tokens not read from the prefix cache
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int

    @classmethod
    def of(cls, usage: TokenUsage) -> MessageUsage:
        return cls(
            input_tokens=max(0, usage.prompt_tokens - usage.cached_tokens),
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=usage.cached_tokens,
        )


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlockOut]
    stop_reason: str | None
    stop_sequence: str | None = None  # the stop sequence that ended the answer, if one did
    usage: MessageUsage


class AnthropicError(BaseModel):
    type: str  # invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
    message: str


class AnthropicErrorOut(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicError


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def message_id(request_id: str) -> str:
    return f"msg_{request_id}"


def stop_reason(finish_reason: str, stop_sequence: str | None = None) -> str:
    """Anthropic's stop_reason for a worker's finish_reason: "stop" is ``stop_sequence`` when the
    worker names the stop string that matched, else end_turn; "abort" passes through."""
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(finish_reason, finish_reason)


def message_out(result: CompletionResult) -> MessageOut:
    return MessageOut(
        id=message_id(result.request_id),
        model=result.model,
        content=[TextBlockOut(text=result.text)],
        stop_reason=stop_reason(result.finish_reason, result.stop_sequence),
        stop_sequence=result.stop_sequence,
        usage=MessageUsage.of(result.usage),
    )


def error_out(err: ClairvoyantError) -> AnthropicErrorOut:
    """Anthropic's error type follows the HTTP status; other 4xx are invalid_request_error."""
    kind = _ERROR_TYPES.get(
        err.http_status, "invalid_request_error" if err.http_status < 500 else "api_error"
    )
    return AnthropicErrorOut(error=AnthropicError(type=kind, message=err.message))


def error_response(err: ClairvoyantError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None or err.http_status == 429:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s or 1)))
    if isinstance(err, RateLimited):
        headers.update(err.headers)
    return JSONResponse(error_out(err).model_dump(), status_code=err.http_status, headers=headers)


def event(name: str, payload: BaseModel | dict[str, Any]) -> bytes:
    """One server-sent event: ``event: <name>``, ``data: <json>`` and a blank line."""
    data = (
        payload.model_dump_json()
        if isinstance(payload, BaseModel)
        else json.dumps(payload, separators=(",", ":"))
    )
    return f"event: {name}\ndata: {data}\n\n".encode()


async def message_events(generation: Generation) -> AsyncIterator[bytes]:
    """The stream: message_start, content_block_start, ping, content_block_delta per text piece,
    content_block_stop, message_delta (stop_reason, usage), message_stop; an ``error`` event ends it
    when the generation fails.  message_start waits for the first piece, which carries the prompt's
    token count."""
    request = generation.request
    try:
        deltas = generation.deltas()
        first = await anext(deltas, None)
        start = MessageOut(
            id=message_id(request.request_id),
            model=request.model,
            content=[],
            stop_reason=None,
            usage=MessageUsage.of(generation.usage),
        )
        yield event("message_start", {"type": "message_start", "message": start.model_dump()})
        yield event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        )
        yield event("ping", {"type": "ping"})
        if first is not None:
            yield _text_delta(first)
            async for text in deltas:
                yield _text_delta(text)
        yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
        assert generation.finish_reason is not None, "deltas() ends only once the worker finished"
        matched = generation.stop_sequence
        delta = {"stop_reason": stop_reason(generation.finish_reason, matched), "stop_sequence": matched}
        usage = MessageUsage.of(generation.usage).model_dump()
        yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        yield event("message_stop", {"type": "message_stop"})
    except ClairvoyantError as err:
        yield event("error", error_out(err))
    finally:
        await generation.close()


def _text_delta(text: str) -> bytes:
    delta = {"type": "text_delta", "text": text}
    return event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})


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
