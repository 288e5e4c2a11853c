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
docs/anthropic-api.md has the table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Annotated, Any, Generic, Literal, NamedTuple, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator
from starlette.background import BackgroundTask

from clairvoyant.core.app_metadata import ID_PATTERN, AppMetadata, parse_app_metadata
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import check_strings, decode_json
from clairvoyant.core.openai_parameters import Status, asks_for_nothing, check_fields
from clairvoyant.core.openai_schema import APP_METADATA_SCHEMA, ChatTurn, InputLimits, invalid_request
from clairvoyant.core.structured import (
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    new_call_id,
    tool_of_last_result,
)
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.generation import Generation, Piece
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.openapi_doc import ERRORS, Responses
from clairvoyant.gateway.ratelimit import RateLimited
from clairvoyant.gateway.request import CompletionResult, Endpoint, GenerationRequest, Sampling, TokenUsage
from clairvoyant.gateway.sessions import SessionTagging, derive_app_metadata

logger = logging.getLogger(__name__)

# CompletionRecord.endpoint and the metrics label of these calls (the worker serves them as chats).
ENDPOINT: Endpoint = "messages"
BLOCK_SEPARATOR = "\n"  # between the text blocks of one turn, and between merged turns
T = TypeVar("T")

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
    MessagesParameter("tools", "supported"),  # client tools; server tools are refused by name
    MessagesParameter("tool_choice", "supported"),
    MessagesParameter("top_k", "refused"),  # the engine samples with temperature and top_p only
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

# Anthropic's rules: a tool's name, and a tool_use block's id.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,256}$")
CLIENT_TOOL_TYPES = (None, "custom")  # any other ``type`` names one of Anthropic's server tools
ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it

_TEXT_BLOCK = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_TOOL_USE_BLOCK = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_use"},
        "id": {"type": "string", "pattern": TOOL_USE_ID.pattern},
        "name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
        "input": {"type": "object"},
    },
    "required": ["type", "id", "name", "input"],
}
_TOOL_RESULT_BLOCK = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
        "is_error": {"type": "boolean"},
    },
    "required": ["type", "tool_use_id"],
}
CONTENT_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _TOOL_USE_BLOCK, _TOOL_RESULT_BLOCK]}},
        ]
    }
)
SYSTEM_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]}
)


class _Strict(BaseModel):
    # As the OpenAI bodies: "0.5" is not a number; fields check_parameters let through are dropped.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class MessageIn(_Strict):
    role: Literal["user", "assistant", "system"]  # a system message mid-conversation, as the SDK types allow
    content: Annotated[Any, CONTENT_SCHEMA] = Field()  # a string or blocks (``parse_message``)


class MetadataIn(_Strict):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = None


class ToolIn(_Strict):
    """A client tool.  Server tools (a ``type`` other than "custom") are refused before this model
    sees them; ``cache_control``, ``input_examples`` and ``eager_input_streaming`` are dropped
    (arguments always stream as they are generated)."""

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None  # true needs Anthropic's tool search: refused
    allowed_callers: list[str] | None = None  # anything but ["direct"] needs code execution: refused

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('must be a JSON Schema of an object ({"type": "object", ...})')
        return value

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description or "",
            parameters=self.input_schema,
            strict=bool(self.strict),
        )


_CHOICE_MODES: dict[str, ToolChoiceMode] = {
    "auto": "auto",
    "any": "required",
    "tool": "function",
    "none": "none",
}


class ToolChoiceIn(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool" only
    disable_parallel_tool_use: bool | None = None

    def choice(self) -> ToolChoice:
        return ToolChoice(_CHOICE_MODES[self.type], self.name or "" if self.type == "tool" else "")


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
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    app_metadata: Annotated[Any, APP_METADATA_SCHEMA] = None  # validated by parse_app_metadata

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(value):
            raise ValueError("stop sequences must not be empty")
        return value

    def turns(self) -> tuple[ChatTurn, ...]:
        """The system prompt (when not empty) and the messages as chat turns (``chat_turns``)."""
        parsed = [parse_message(message, f"messages[{i}]") for i, message in enumerate(self.messages)]
        system = text_of(self.system, "system") if self.system is not None else ""
        if system:
            parsed.insert(0, ParsedMessage("system", "system", system))
        return chat_turns(parsed)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools; InvalidRequest for one that asks for a server-side feature, or a repeated name."""
        names: set[str] = set()
        for i, tool in enumerate(self.tools or ()):
            param = f"tools[{i}]"
            if tool.defer_loading:
                raise _refused(f"{param}.defer_loading", "deferred tools need a server-side tool search")
            if tool.allowed_callers not in (None, ["direct"]):
                raise _refused(
                    f"{param}.allowed_callers", 'only ["direct"]: there is no server-side code execution'
                )
            if tool.name in names:
                raise InvalidRequest(
                    f"{param}.name: tool names must be unique; {tool.name!r} is repeated",
                    param=f"{param}.name",
                    code="invalid_value",
                )
            names.add(tool.name)
        return tuple(tool.spec() for tool in self.tools or ())

    def choice(self, tools: Sequence[ToolSpec]) -> ToolChoice | None:
        """The tool choice; InvalidRequest for "any" or "tool" without tools, and for a "tool" choice
        that names no tool.  None (auto) when unset."""
        chosen = self.tool_choice
        if chosen is None:
            return None
        if chosen.type in ("any", "tool") and not tools:
            raise InvalidRequest(
                f"tool_choice {{'type': {chosen.type!r}}} needs tools",
                param="tool_choice",
                code="invalid_value",
            )
        if chosen.type == "tool" and chosen.name not in {tool.name for tool in tools}:
            raise InvalidRequest(
                f"tool_choice.name: {chosen.name!r} names none of the tools",
                param="tool_choice.name",
                code="invalid_value",
            )
        return chosen.choice()


def _refused(param: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{param} is not supported here: {why}", param=param, code="unsupported_parameter")


class Located(NamedTuple, Generic[T]):
    value: T
    param: str  # where the block sits, for errors


class ParsedMessage(NamedTuple):
    """One message's blocks, read but not yet paired with its neighbours."""

    role: str
    param: str  # messages[i]
    text: str | None  # its text blocks joined; None when it held tool blocks only
    calls: tuple[Located[ToolCall], ...] = ()  # assistant: its tool_use blocks
    results: tuple[Located[ChatTurn], ...] = ()  # user: its tool_result blocks, as tool turns


def parse_message(message: MessageIn, param: str) -> ParsedMessage:
    """A message's blocks: text anywhere, tool_use in an assistant message, tool_result in a user
    message before any text (as Anthropic requires).  InvalidRequest naming the first bad block."""
    content = message.content
    if not isinstance(content, list):
        return ParsedMessage(message.role, param, text_of(content, f"{param}.content"))
    allowed = {"user": "tool_result", "assistant": "tool_use"}.get(message.role)
    texts: list[str] = []
    calls: list[Located[ToolCall]] = []
    results: list[Located[ChatTurn]] = []
    for j, block in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == allowed == "tool_use":
            calls.append(Located(tool_use(block, where), where))
        elif kind == allowed == "tool_result":
            if texts:
                raise InvalidRequest(
                    f"{where}: tool_result blocks must come before any text in a message",
                    param=where,
                    code="invalid_value",
                )
            results.append(Located(tool_result(block, where), where))
        else:
            kinds = " or ".join(repr(k) for k in ("text", allowed) if k)
            raise InvalidRequest(
                f"{where} must be a {kinds} block in {_article(message.role)} message; got {kind!r}",
                param=where,
                code="unsupported_content",
            )
    text = BLOCK_SEPARATOR.join(texts) if texts or not (calls or results) else None
    return ParsedMessage(message.role, param, text, tuple(calls), tuple(results))


def _article(role: str) -> str:
    return f"an {role}" if role == "assistant" else f"a {role}"


def tool_use(block: dict[str, Any], where: str) -> ToolCall:
    """A tool_use block as a call; ``arguments`` is the JSON text of its ``input``."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not TOOL_USE_ID.match(call_id):
        raise _bad(f"{where}.id", "must be a string of A-Z a-z 0-9 _ - (toolu_...)")
    if not isinstance(name, str) or not re.match(TOOL_NAME_PATTERN, name):
        raise _bad(f"{where}.name", "must be a tool name of 1 to 128 characters from A-Z a-z 0-9 _ -")
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.input", "must be an object")
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def tool_result(block: dict[str, Any], where: str) -> ChatTurn:
    """A tool_result block as a ``tool`` turn.  Chat templates have no error flag: an ``is_error``
    result reaches the model with ``ERROR_PREFIX`` before its text."""
    call_id, is_error = block.get("tool_use_id"), block.get("is_error")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id", "must be the id of a tool_use block")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error", "must be a boolean")
    content = block.get("content")
    text = "" if content is None else text_of(content, f"{where}.content")
    if is_error:
        text = ERROR_PREFIX + text if text else ERROR_PREFIX.rstrip(": ")
    return ChatTurn("tool", text, tool_call_id=call_id)


def _bad(param: str, rule: str) -> InvalidRequest:
    return InvalidRequest(f"{param} {rule}", param=param, code="invalid_value")


def chat_turns(messages: Sequence[ParsedMessage]) -> tuple[ChatTurn, ...]:
    """Parsed messages as chat turns.

    Consecutive messages of one role merge (Anthropic's API combines them): their texts joined by
    ``BLOCK_SEPARATOR``, their calls in order.  A user message's tool results become ``tool``
    turns, ahead of its text (a ``user`` turn).  As Anthropic requires, the message after an
    assistant message with tool_use blocks answers each of them with a tool_result, and a
    tool_result answers a call of the assistant message right before it; a tool_use id is used
    once.  InvalidRequest otherwise, and for a final assistant turn: Anthropic continues it
    (prefill), while the worker's chat template would start a new turn after it."""
    turns: list[ChatTurn] = []
    used_ids: set[str] = set()
    open_calls: dict[str, str] = {}  # the previous assistant group's calls: id -> tool name
    open_param = ""
    for group in _groups(messages):
        role = group[0].role
        answered = _answer(open_calls, group) if role == "user" else {}
        missing = [call_id for call_id in open_calls if call_id not in answered]
        if missing:
            raise InvalidRequest(
                f"{open_param}: tool_use ids were found without tool_result blocks right after: "
                f"{', '.join(missing)}; each tool_use needs a tool_result in the next message",
                param=open_param,
                code="invalid_value",
            )
        calls = [located for message in group for located in message.calls]
        for call, where in calls:
            if call.id in used_ids:
                raise _bad(f"{where}.id", f"repeats the id {call.id!r} of an earlier tool_use block")
            used_ids.add(call.id)
        open_calls = {call.id: call.name for call, _ in calls}
        open_param = group[-1].param
        turns.extend(
            dataclasses.replace(result, name=answered[result.tool_call_id or ""])
            for message in group
            for result, _ in message.results
        )
        texts = [message.text for message in group if message.text is not None]
        if texts or calls:
            turns.append(
                ChatTurn(role, BLOCK_SEPARATOR.join(texts), tool_calls=tuple(call for call, _ in calls))
            )
    if turns[-1].role == "assistant":
        param = messages[-1].param
        raise InvalidRequest(
            f"{param}: a final assistant message (prefill) is not supported; end with a user message",
            param=param,
            code="unsupported_prefill",
        )
    return tuple(turns)


def _groups(messages: Sequence[ParsedMessage]) -> list[list[ParsedMessage]]:
    groups: list[list[ParsedMessage]] = []
    for message in messages:
        if groups and groups[-1][0].role == message.role:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _answer(open_calls: Mapping[str, str], group: Sequence[ParsedMessage]) -> dict[str, str]:
    """The calls a user group's tool results answer: id -> tool name.  InvalidRequest for a result
    that answers no call of the assistant message before it, or one already answered."""
    answered: dict[str, str] = {}
    for message in group:
        for result, where in message.results:
            call_id = result.tool_call_id or ""
            if call_id not in open_calls:
                raise _bad(
                    f"{where}.tool_use_id",
                    f"must answer a tool_use block of the assistant message right before it; {call_id!r} does not",
                )
            if call_id in answered:
                raise _bad(f"{where}.tool_use_id", f"answers {call_id!r} a second time")
            answered[call_id] = open_calls[call_id]
    return answered


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
        if kind != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(
                f"{where} must be {{'type': 'text', 'text': <string>}}; only text blocks are supported here, got {kind!r}",
                param=where,
                code="unsupported_content",
            )
        texts.append(block["text"])
    return BLOCK_SEPARATOR.join(texts)


def check_tool_types(tools: object) -> None:
    """InvalidRequest naming the first server tool (``web_search_20250305``, ``bash_20250124``, ...):
    they run on Anthropic's side, and there is nothing here to run them."""
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in CLIENT_TOOL_TYPES:
            raise InvalidRequest(
                f"tools[{i}] is the server tool {str(kind)[:64]!r}, which is not supported here; "
                "only client tools ({'name', 'description', 'input_schema'}) are",
                param=f"tools[{i}].type",
                code="unsupported_tool",
            )


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
    check_tool_types(raw.get("tools"))
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
    tools = body.tool_specs()
    choice = body.choice(tools)
    parallel = not (body.tool_choice is not None and body.tool_choice.disable_parallel_tool_use)
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
        tools=tools,
        tool_choice=choice if tools else None,
        parallel_tool_calls=parallel,
    )


def with_last_tool(meta: AppMetadata | None, chat: Sequence[ChatTurn]) -> AppMetadata | None:
    """``meta`` with its ``tool`` set, when the client left it unset, to the tool whose result the
    conversation ends with (``tool_of_last_result``).  A user message may follow its tool results
    with text: that text turn is skipped, the request still follows the tool."""
    if meta is None or meta.tool is not None:
        return meta
    if len(chat) >= 2 and chat[-1].role == "user" and chat[-2].role == "tool":
        chat = chat[:-1]
    tool = tool_of_last_result(chat)
    return dataclasses.replace(meta, tool=tool) if tool is not None else meta


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


class ToolUseBlockOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str  # toolu_...
    name: str
    input: dict[str, Any]


ContentBlockOut = Annotated[TextBlockOut | ToolUseBlockOut, Field(discriminator="type")]


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
    content: list[ContentBlockOut]
    stop_reason: str | None
    stop_sequence: str | None = None  # the stop sequence that ended the answer, if one did
    usage: MessageUsage


class AnthropicError(BaseModel):
    type: str  # invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
    message: str


class AnthropicErrorOut(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicError


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
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


def tool_use_id(call_id: str) -> str:
    """The tool_use id of a worker's call: ``call_<x>`` becomes ``toolu_<x>``.  Requests carry the
    client's ids to the worker as they are, so a round trip needs no mapping back.  A fresh id
    when the engine gave none, or one Anthropic's rule for ids would refuse."""
    if call_id.startswith("toolu_") and TOOL_USE_ID.match(call_id):
        return call_id
    suffix = call_id.removeprefix("call_")
    return "toolu_" + suffix if suffix and TOOL_USE_ID.match(suffix) else new_call_id("toolu_")


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as a tool_use ``input``: the JSON object they spell ("" is ``{}``, a call
    without arguments), or None when they spell no object.  The worker's grammar always makes an
    object; an engine without one may not, and such a call is answered as text."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stop_reason(finish_reason: str, stop_sequence: str | None = None, *, called: bool = True) -> str:
    """Anthropic's stop_reason for a worker's finish_reason: "stop" is ``stop_sequence`` when the
    worker names the stop string that matched, else end_turn; "tool_calls" is tool_use when the
    answer holds a tool_use block (``called``), else end_turn; "abort" passes through."""
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "tool_calls" and not called:
        return "end_turn"
    return _STOP_REASONS.get(finish_reason, finish_reason)


def content_blocks(text: str, calls: Sequence[ToolCall]) -> list[TextBlockOut | ToolUseBlockOut]:
    """The text block (when there is text, or nothing else), then a tool_use block per call.  A
    call whose arguments spell no JSON object joins the text as those arguments."""
    uses: list[TextBlockOut | ToolUseBlockOut] = []
    texts = [text] if text else []
    for call in calls:
        arguments = tool_input(call.arguments)
        if arguments is None:
            logger.warning("tool call %r has arguments that are no JSON object; answered as text", call.name)
            texts.append(call.arguments)
        else:
            uses.append(ToolUseBlockOut(id=tool_use_id(call.id), name=call.name, input=arguments))
    if texts or not uses:
        return [TextBlockOut(text=BLOCK_SEPARATOR.join(texts)), *uses]
    return uses


def message_out(result: CompletionResult) -> MessageOut:
    content = content_blocks(result.text, result.tool_calls)
    called = any(isinstance(block, ToolUseBlockOut) for block in content)
    return MessageOut(
        id=message_id(result.request_id),
        model=result.model,
        content=content,
        stop_reason=stop_reason(result.finish_reason, result.stop_sequence, called=called),
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


class ContentEvents:
    """The content-block events of one choice's pieces, in Anthropic's order: a text block while
    text arrives, a tool_use block per call (opened by the call's first piece, with ``input: {}``;
    each argument fragment an ``input_json_delta``).  One block is open at a time: a new one closes
    it, so the text block closes before the first tool_use block opens.  ``ping`` follows the first
    ``content_block_start``, as Anthropic sends it.

        index:  0 text   1 tool_use (call 0)   2 tool_use (call 1)
        events: start delta* stop | start json* stop | start json* stop

    Arguments stream as the engine makes them (the worker's grammar keeps them a JSON object)."""

    def __init__(self) -> None:
        self.blocks = 0  # blocks started so far; the next one's index
        self.open: str | None = None  # the open block's type
        self.uses: dict[int, int] = {}  # call index -> its block's index

    @property
    def called(self) -> bool:
        return bool(self.uses)

    def feed(self, piece: Piece) -> list[bytes]:
        out: list[bytes] = []
        if piece.text:
            if self.open != "text":
                out += self._start({"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": piece.text}))
        for delta in piece.tool_calls:
            if delta.index not in self.uses:
                block = {"type": "tool_use", "id": tool_use_id(delta.id), "name": delta.name, "input": {}}
                out += self._start(block)
                self.uses[delta.index] = self.blocks - 1
            if delta.arguments:
                fragment = {"type": "input_json_delta", "partial_json": delta.arguments}
                out.append(self._delta(fragment, self.uses[delta.index]))
        return out

    def finish(self) -> list[bytes]:
        """Close the open block; an answer with no content still gets its (empty) text block."""
        out = [] if self.blocks else self._start({"type": "text", "text": ""})
        return out + self._close()

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self.blocks, "content_block": block},
            )
        )
        if self.blocks == 0:
            out.append(event("ping", {"type": "ping"}))
        self.blocks += 1
        self.open = block["type"]
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        index = self.blocks - 1 if index is None else index
        return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


async def message_events(generation: Generation) -> AsyncIterator[bytes]:
    """The stream: message_start, the content blocks (``ContentEvents``), message_delta
    (stop_reason, usage), message_stop; an ``error`` event ends it when the generation fails.
    message_start waits for the first piece, which carries the prompt's token count."""
    request = generation.request
    try:
        pieces = generation.chunks()
        first = await anext(pieces, None)
        start = MessageOut(
            id=message_id(request.request_id),
            model=request.model,
            content=[],
            stop_reason=None,
            usage=MessageUsage.of(generation.usage),
        )
        yield event("message_start", {"type": "message_start", "message": start.model_dump()})
        blocks = ContentEvents()
        if first is not None:
            for data in blocks.feed(first):
                yield data
            async for piece in pieces:
                for data in blocks.feed(piece):
                    yield data
        for data in blocks.finish():
            yield data
        assert generation.finish_reason is not None, "chunks() ends only once the worker finished"
        matched = generation.stop_sequence
        reason = stop_reason(generation.finish_reason, matched, called=blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": matched}
        usage = MessageUsage.of(generation.usage).model_dump()
        yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        yield event("message_stop", {"type": "message_stop"})
    except ClairvoyantError as err:
        yield event("error", error_out(err))
    finally:
        await generation.close()


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
