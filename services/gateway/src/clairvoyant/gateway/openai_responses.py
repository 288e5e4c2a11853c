"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``
(docs/responses-api.md).

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
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.background import BackgroundTask

from clairvoyant.core.app_metadata import parse_app_metadata
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.json_input import check_strings
from clairvoyant.core.openai_parameters import Status, check_fields
from clairvoyant.core.openai_schema import ChatTurn, InputLimits, invalid_request
from clairvoyant.core.structured import (
    OutputConstraint,
    ToolCall,
    ToolCallPiece,
    ToolChoice,
    ToolChoiceMode,
    ToolSpec,
    new_call_id,
)
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.generation import Generation
from clairvoyant.gateway.http_common import CLIENT_CLOSED, SSE_HEADERS, read_json, until_disconnected
from clairvoyant.gateway.openapi_doc import error_responses
from clairvoyant.gateway.request import CompletionResult, Endpoint, GenerationRequest, Sampling, TokenUsage
from clairvoyant.gateway.response_store import ResponseStore, StoredResponse
from clairvoyant.gateway.sessions import derive_conversation_metadata

logger = logging.getLogger(__name__)

ENDPOINT: Endpoint = "responses"
RESPONSE_PREFIX = "resp_"
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's metadata limits

# ---- parameters ---------------------------------------------------------------------------------


class ResponsesParameter(NamedTuple):
    name: str
    status: Status
    passes: tuple[object, ...] = ()  # refused only: values (besides null) that ask for nothing


PARAMETERS: tuple[ResponsesParameter, ...] = (
    ResponsesParameter("model", "supported"),
    ResponsesParameter("input", "supported"),
    ResponsesParameter("instructions", "supported"),
    ResponsesParameter("tools", "supported"),
    ResponsesParameter("tool_choice", "supported"),
    ResponsesParameter("parallel_tool_calls", "supported"),
    ResponsesParameter("max_output_tokens", "supported"),
    ResponsesParameter("temperature", "supported"),
    ResponsesParameter("top_p", "supported"),
    ResponsesParameter("text", "supported"),
    ResponsesParameter("stream", "supported"),
    ResponsesParameter("store", "supported"),
    ResponsesParameter("previous_response_id", "supported"),
    ResponsesParameter("metadata", "supported"),  # kept with a stored response and echoed
    ResponsesParameter("user", "supported"),  # echoed; the tenant comes from the API key
    ResponsesParameter("app_metadata", "extension"),
    # Abuse-detection ids and caching hints: the prefix cache keys on the prompt and the workflow.
    ResponsesParameter("safety_identifier", "ignored"),
    ResponsesParameter("prompt_cache_key", "ignored"),
    ResponsesParameter("prompt_cache_retention", "ignored"),
    ResponsesParameter("prompt_cache_options", "ignored"),
    # One tier: the scheduler's policy orders requests, not the client.
    ResponsesParameter("service_tier", "ignored"),
    # Only include_obfuscation, padding against side channels; the stream has none.
    ResponsesParameter("stream_options", "ignored"),
    # Dropping input to fit the context would change the answer; disabled (the default) is what runs.
    ResponsesParameter("truncation", "refused", ("disabled",)),
    ResponsesParameter("include", "refused", ([],)),  # logprobs, encrypted reasoning, hosted tools' output
    ResponsesParameter("reasoning", "refused", ({},)),  # the engine produces no reasoning items
    ResponsesParameter("background", "refused", (False,)),
    ResponsesParameter("background_options", "refused"),
    ResponsesParameter("conversation", "refused"),  # conversations live in previous_response_id chains
    ResponsesParameter("context_management", "refused", ([],)),
    ResponsesParameter("prompt", "refused"),  # stored prompt templates
    ResponsesParameter("max_tool_calls", "refused"),
    ResponsesParameter("top_logprobs", "refused", (0,)),
    ResponsesParameter("access_programs", "refused"),
    ResponsesParameter("image", "refused"),
    ResponsesParameter("moderation", "refused"),
)
_BY_NAME = {p.name: p for p in PARAMETERS}


def check_parameters(body: Mapping[str, object], *, lenient: bool) -> None:
    """Raise InvalidRequest for the first refused (asking for something) or, unless ``lenient``,
    unknown field of ``body`` (``openai_parameters.check_fields``)."""
    check_fields(body, _BY_NAME, lenient=lenient)


# ---- the request --------------------------------------------------------------------------------


class ResponsesBody(BaseModel):
    # As the chat body: "0.5" is not a number; fields check_parameters let through are dropped.
    # Fields typed Any are checked by hand below, for an error that names where it sits.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    model: str = Field(min_length=1)
    input: Any = None
    instructions: str | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: Any = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, str] | None = None
    user: str | None = None
    app_metadata: Any = None


def invalid(param: str, message: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code=code)


def text_of(content: object, param: str, kinds: tuple[str, ...] = ("input_text", "output_text")) -> str:
    """A string, or the text of a list of ``input_text``/``output_text`` parts, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of text parts", "invalid_type")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise invalid(
                f"{param}[{j}]",
                f"only {' and '.join(kinds)} parts ({{'type': ..., 'text': <string>}}) are supported, got {kind!r}",
                "unsupported_content",
            )
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid(f"{where}.{key}", "is required and must be a string", "invalid_type")
    return value


def input_turns(value: object, max_items: int) -> list[ChatTurn]:
    """``input`` as chat turns: a string is one user turn; in a list, consecutive ``function_call``
    items join the assistant turn before them, and a ``function_call_output`` is a tool turn
    (``named_results`` names it after its call)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [ChatTurn("user", value)]
    if not isinstance(value, list):
        raise invalid("input", "must be a string or a list of input items", "invalid_type")
    if len(value) > max_items:
        raise invalid(
            "input", f"has {len(value)} items; at most {max_items} are allowed", "array_above_max_length"
        )
    turns: list[ChatTurn] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an object", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"{where}.role", "must be user, system, developer or assistant")
            content = text_of(item.get("content"), f"{where}.content")
            turns.append(ChatTurn("system" if role == "developer" else role, content))
        elif kind == "function_call":
            call = ToolCall(
                _string(item, "call_id", where),
                _string(item, "name", where),
                _string(item, "arguments", where),
            )
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant":
                turns[-1] = dataclasses.replace(last, tool_calls=(*last.tool_calls, call))
            else:
                turns.append(ChatTurn("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            output = text_of(item.get("output"), f"{where}.output", ("input_text",))
            turns.append(ChatTurn("tool", output, tool_call_id=call_id))
        else:
            raise invalid(
                f"{where}.type",
                f"input items of type {kind!r} are not supported; send message, function_call or "
                "function_call_output items",
                "unsupported_content",
            )
    return turns


def named_results(turns: Sequence[ChatTurn]) -> tuple[ChatTurn, ...]:
    """``turns`` with each unnamed tool result named after the function of the call it answers
    (chat templates render a result with its tool's name)."""
    names: dict[str, str] = {}  # call id -> function name
    named = []
    for turn in turns:
        names.update((call.id, call.name) for call in turn.tool_calls)
        if turn.role == "tool" and turn.name is None and turn.tool_call_id in names:
            turn = dataclasses.replace(turn, name=names[turn.tool_call_id])
        named.append(turn)
    return tuple(named)


def parse_tools(value: object) -> tuple[ToolSpec, ...]:
    """Function tools, flat as the Responses API has them; any other tool type is refused."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools", "must be a list of tools", "invalid_type")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(where, "must be an object", "invalid_type")
        kind = tool.get("type")
        if kind != "function":
            raise invalid(
                f"{where}.type", f"only function tools are supported, got {kind!r}", "unsupported_tool"
            )
        name = tool.get("name")
        if name is None and isinstance(tool.get("function"), dict):
            raise invalid(
                f"{where}.name",
                "is required: Responses API tools are flat ({type, name, description, parameters, strict}), "
                "not nested under 'function' as in chat completions",
                "missing_required_parameter",
            )
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise invalid(f"{where}.name", "must be 1 to 64 characters from a-z A-Z 0-9 _ -")
        if any(t.name == name for t in tools):
            raise invalid(f"{where}.name", f"a tool named {name!r} is already listed", "duplicate_tool")
        description, parameters, strict = tool.get("description"), tool.get("parameters"), tool.get("strict")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.description", "must be a string", "invalid_type")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid(f"{where}.parameters", "must be a JSON Schema object", "invalid_type")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{where}.strict", "must be a boolean", "invalid_type")
        tools.append(ToolSpec(name, description or "", parameters, True if strict is None else strict))
    return tuple(tools)


_MODES: dict[str, ToolChoiceMode] = {"auto": "auto", "none": "none", "required": "required"}


def parse_tool_choice(value: object, tools: Sequence[ToolSpec]) -> ToolChoice | None:
    if value is None:
        return None
    if isinstance(value, str) and value in _MODES:
        if value == "required" and not tools:
            raise invalid("tool_choice", "'required' needs at least one tool in tools")
        return ToolChoice(_MODES[value]) if tools else None
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not any(tool.name == name for tool in tools):
            raise invalid("tool_choice.name", f"names no function in tools: {name!r}")
        return ToolChoice("function", str(name))
    raise invalid(
        "tool_choice",
        "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "unsupported_tool_choice",
    )


def parse_text_format(value: object) -> OutputConstraint | None:
    """``text.format``: ``text`` (no constraint), ``json_object``, or ``json_schema`` (the output
    is held to ``schema`` whether ``strict`` is set or not)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("text", "must be an object", "invalid_type")
    verbosity = value.get("verbosity")
    if verbosity not in (None, "medium"):
        raise invalid(
            "text.verbosity",
            "is not supported here; leave it unset or send 'medium'",
            "unsupported_parameter",
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        _string(fmt, "name", "text.format")
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise invalid(
                "text.format.schema", "is required and must be a JSON Schema object", "invalid_type"
            )
        return OutputConstraint.of_schema(schema)
    raise invalid("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")


def check_metadata(metadata: Mapping[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"holds at most {MAX_METADATA_PAIRS} pairs", "array_above_max_length")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise invalid(
                "metadata", f"keys are at most {MAX_METADATA_KEY} characters, values {MAX_METADATA_VALUE}"
            )


class ParsedRequest(NamedTuple):
    body: ResponsesBody
    instructions: tuple[ChatTurn, ...]  # the system turn from ``instructions``, if any
    turns: tuple[ChatTurn, ...]  # this request's own input
    tools: tuple[ToolSpec, ...]
    tool_choice: ToolChoice | None
    constraint: OutputConstraint | None

    @property
    def stores(self) -> bool:
        return self.body.store is not False  # OpenAI's default: stored


def validate_body(raw: object, limits: InputLimits) -> ParsedRequest:
    """The decoded JSON body, validated.  Raises InvalidRequest naming the first offending parameter."""
    check_strings(raw, limits.max_string_chars)
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_body")
    check_parameters(raw, lenient=limits.lenient_parameters)
    try:
        body = ResponsesBody.model_validate(raw)
    except ValidationError as exc:
        raise invalid_request(exc) from None
    check_metadata(body.metadata)
    tools = parse_tools(body.tools)
    return ParsedRequest(
        body=body,
        instructions=(ChatTurn("system", body.instructions),) if body.instructions else (),
        turns=tuple(input_turns(body.input, limits.max_messages)),
        tools=tools,
        tool_choice=parse_tool_choice(body.tool_choice, tools),
        constraint=parse_text_format(body.text),
    )


def to_request(
    parsed: ParsedRequest,
    history: Sequence[ChatTurn],
    *,
    tenant: str,
    request_id: str,
    arrival_time: float,
    max_tokens_limit: int,
) -> GenerationRequest:
    """The generation request: instructions, then the stored conversation, then this input."""
    body = parsed.body
    if body.max_output_tokens is not None and body.max_output_tokens > max_tokens_limit:
        raise invalid("max_output_tokens", f"must be at most {max_tokens_limit}")
    chat = named_results((*parsed.instructions, *history, *parsed.turns))
    if not any(turn.role != "system" for turn in chat):
        raise invalid(
            "input", "is required: the conversation holds no message to answer", "missing_required_parameter"
        )
    return GenerationRequest(
        request_id=request_id,
        tenant=tenant,
        endpoint=ENDPOINT,
        model=body.model,
        sampling=Sampling(
            max_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            constraint=parsed.constraint,
        ),
        arrival_time=arrival_time,
        chat=chat,
        app_metadata=parse_app_metadata(body.app_metadata) if body.app_metadata is not None else None,
        stream=bool(body.stream),
        tools=parsed.tools,
        tool_choice=parsed.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )


# ---- the response -------------------------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int  # the whole prompt, cached tokens included (as OpenAI counts)
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: TokenUsage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )


class ResponseOut(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool
    temperature: float | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
    metadata: dict[str, str]


def response_id(request_id: str) -> str:
    return RESPONSE_PREFIX + request_id


def response_shell(parsed: ParsedRequest, request: GenerationRequest) -> ResponseOut:
    """The response before any output: what the request asked for, echoed as OpenAI echoes it."""
    body = parsed.body
    choice = parsed.tool_choice
    tool_choice: str | dict[str, Any] = (
        {"type": "function", "name": choice.name}
        if choice is not None and choice.mode == "function"
        else choice.mode
        if choice is not None
        else str(body.tool_choice or "auto")
    )
    tools = [
        {"type": "function", "name": t.name, "description": t.description or None, "parameters": t.parameters,
         "strict": t.strict}
        for t in parsed.tools
    ]  # fmt: skip
    text_format = body.text.get("format") if isinstance(body.text, dict) else None
    return ResponseOut(
        id=response_id(request.request_id),
        created_at=int(request.arrival_time),
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=request.model,
        output=[],
        parallel_tool_calls=request.parallel_tool_calls,
        previous_response_id=body.previous_response_id,
        store=parsed.stores,
        temperature=body.temperature,
        text={"format": text_format or {"type": "text"}},
        tool_choice=tool_choice,
        tools=tools,
        top_p=body.top_p,
        user=body.user,
        metadata=dict(body.metadata or {}),
    )


def finished(
    shell: ResponseOut, output: list[OutputItem], finish_reason: str, usage: TokenUsage
) -> ResponseOut:
    """``shell`` with its output, status and usage: a generation cut at its token limit is
    ``incomplete`` (reason ``max_output_tokens``), as are its unfinished items."""
    incomplete = finish_reason == "length"
    return shell.model_copy(
        update={
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output,
            "usage": ResponseUsage.of(usage),
        }
    )


def output_of(result: CompletionResult) -> list[OutputItem]:
    """The output items of a whole answer: its text as a message (left out when it is only
    whitespace beside tool calls), then one ``function_call`` item per call.  The token limit
    leaves the last item ``incomplete``, as a stream closes it."""
    rid = result.request_id
    items: list[OutputItem] = []
    if result.text.strip() or not result.tool_calls:
        items.append(
            MessageItem(id=f"msg_{rid}_0", status="completed", content=[OutputText(text=result.text)])
        )
    for call in result.tool_calls:
        index = len(items)
        items.append(
            FunctionCallItem(
                id=f"fc_{rid}_{index}", call_id=call.id or new_call_id(), name=call.name,
                arguments=call.arguments, status="completed",
            )
        )  # fmt: skip
    if result.finish_reason == "length":
        items[-1].status = "incomplete"
    return items


def assistant_turn(output: Sequence[OutputItem]) -> ChatTurn:
    """The output as the assistant turn a later request in the chain sees."""
    text = "".join(part.text for item in output if isinstance(item, MessageItem) for part in item.content)
    calls = tuple(
        ToolCall(item.call_id, item.name, item.arguments)
        for item in output
        if isinstance(item, FunctionCallItem)
    )
    return ChatTurn("assistant", text, tool_calls=calls)


# ---- streaming ----------------------------------------------------------------------------------


def sse(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class StreamedOutput:
    """Turns the worker's pieces into Responses events, keeping the items they build.

    One item is open at a time: text opens (or continues) a message, a tool-call piece with a new
    index opens a function call, and opening an item closes the one before.  Whitespace-only text
    waits until more text follows, so a newline beside tool calls makes no message of its own.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.items: list[OutputItem] = []
        self._sequence = 0
        self._open: OutputItem | None = None
        self._call_index: int | None = None  # the worker's index of the open call
        self._held_text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(payload)

    def text(self, text: str) -> list[bytes]:
        if not isinstance(self._open, MessageItem) and not (self._held_text + text).strip():
            self._held_text += text
            return []
        text, self._held_text = self._held_text + text, ""
        events = [] if isinstance(self._open, MessageItem) else self._open_message()
        return [*events, self._delta(text)]

    def call(self, piece: ToolCallPiece) -> list[bytes]:
        events = []
        if not isinstance(self._open, FunctionCallItem) or piece.index != self._call_index:
            events.extend(self.close())
            index = len(self.items)
            item = FunctionCallItem(
                id=f"fc_{self.request_id}_{index}", call_id=piece.id or new_call_id(), name=piece.name,
                arguments="", status="in_progress",
            )  # fmt: skip
            self.items.append(item)
            self._open, self._call_index = item, piece.index
            events.append(
                self.event("response.output_item.added", output_index=index, item=item.model_dump())
            )
        call = self._open
        assert isinstance(call, FunctionCallItem)
        if piece.name and not call.name:
            call.name = piece.name
        if piece.arguments:
            call.arguments += piece.arguments
            events.append(
                self.event(
                    "response.function_call_arguments.delta", item_id=call.id, output_index=len(self.items) - 1,
                    delta=piece.arguments,
                )
            )  # fmt: skip
        return events

    def finish(self, finish_reason: str) -> list[bytes]:
        """Close the open item (``incomplete`` when the token limit cut it); a response with no
        item gets an (empty) message, as a whole answer does."""
        events = []
        if not self.items:
            held, self._held_text = self._held_text, ""
            events = self._open_message()
            if held:
                events.append(self._delta(held))
        return events + self.close("incomplete" if finish_reason == "length" else "completed")

    def close(self, status: Literal["completed", "incomplete"] = "completed") -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        index = len(self.items) - 1
        if isinstance(item, MessageItem):
            part = item.content[0]
            return [
                self.event(
                    "response.output_text.done", item_id=item.id, output_index=index, content_index=0,
                    text=part.text, logprobs=[],
                ),
                self.event(
                    "response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                    part=part.model_dump(),
                ),
                self.event("response.output_item.done", output_index=index, item=item.model_dump()),
            ]  # fmt: skip
        return [
            self.event(
                "response.function_call_arguments.done", item_id=item.id, output_index=index, name=item.name,
                arguments=item.arguments,
            ),
            self.event("response.output_item.done", output_index=index, item=item.model_dump()),
        ]  # fmt: skip

    def _open_message(self) -> list[bytes]:
        events = self.close()
        index = len(self.items)
        message = MessageItem(id=f"msg_{self.request_id}_{index}", status="in_progress", content=[])
        self.items.append(message)
        events.append(self.event("response.output_item.added", output_index=index, item=message.model_dump()))
        message.content.append(OutputText(text=""))
        events.append(
            self.event(
                "response.content_part.added", item_id=message.id, output_index=index, content_index=0,
                part=OutputText(text="").model_dump(),
            )
        )  # fmt: skip
        self._open = message
        return events

    def _delta(self, text: str) -> bytes:
        message = self._open
        assert isinstance(message, MessageItem), "text goes to an open message"
        message.content[0].text += text
        return self.event(
            "response.output_text.delta", item_id=message.id, output_index=len(self.items) - 1, content_index=0,
            delta=text, logprobs=[],
        )  # fmt: skip


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
