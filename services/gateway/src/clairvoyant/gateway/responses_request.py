"""The request side of ``POST /v1/responses``: the parameter table, the body model, its
validation (``validate_body``) and the ``GenerationRequest`` it makes (``to_request``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clairvoyant.core.app_metadata import parse_app_metadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.json_input import check_strings
from clairvoyant.core.openai_parameters import Status, check_fields
from clairvoyant.core.openai_schema import ChatTurn, InputLimits, invalid_request
from clairvoyant.core.structured import OutputConstraint, ToolChoice, ToolSpec
from clairvoyant.gateway.request import Endpoint, GenerationRequest, Sampling
from clairvoyant.gateway.responses_input import (
    check_metadata,
    input_turns,
    invalid,
    named_results,
    parse_text_format,
    parse_tool_choice,
    parse_tools,
)

ENDPOINT: Endpoint = "responses"


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


# ---- the body -----------------------------------------------------------------------------------


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
