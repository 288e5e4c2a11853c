"""The request side of ``POST /v1/messages``: the parameter table, the body models, their
validation (``validate_body``), and the ``GenerationRequest`` a body makes (``to_request``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import ConfigDict, Field, ValidationError, field_validator

from clairvoyant.core.app_metadata import AppMetadata, parse_app_metadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.json_input import check_strings
from clairvoyant.core.openai_parameters import Status, asks_for_nothing, check_fields
from clairvoyant.core.openai_schema import APP_METADATA_SCHEMA, ChatTurn, InputLimits, invalid_request
from clairvoyant.core.structured import ToolChoice, ToolChoiceMode, ToolSpec, tool_of_last_result
from clairvoyant.gateway.anthropic_content import SYSTEM_SCHEMA, TOOL_NAME_PATTERN, MessageIn, Strict
from clairvoyant.gateway.anthropic_turns import ParsedMessage, chat_turns, parse_message, text_of
from clairvoyant.gateway.request import Endpoint, GenerationRequest, Sampling

# CompletionRecord.endpoint and the metrics label of these calls (the worker serves them as chats).
ENDPOINT: Endpoint = "messages"


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


# ---- the body -----------------------------------------------------------------------------------

CLIENT_TOOL_TYPES = (None, "custom")  # any other ``type`` names one of Anthropic's server tools


class MetadataIn(Strict):
    model_config = ConfigDict(extra="forbid")
    user_id: str | None = None


class ToolIn(Strict):
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


class ToolChoiceIn(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool" only
    disable_parallel_tool_use: bool | None = None

    def choice(self) -> ToolChoice:
        return ToolChoice(_CHOICE_MODES[self.type], self.name or "" if self.type == "tool" else "")


class MessagesBody(Strict):
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
