"""The OpenAI API's request bodies, one schema for every HTTP edge that speaks it (the gateway, and
the worker's own endpoint).  Pydantic only: no transport, no service types.  Beside it:
``openai_messages`` (a chat body's messages and tools), ``openai_structure`` (tools, tool choice
and output constraints parsed) and ``openai_output`` (the response shapes).

Contract of ``validate_body``: a top-level field is held to ``openai_parameters``' table first
(a refused parameter is InvalidRequest ``unsupported_parameter``; an unknown one is
``unknown_parameter`` unless ``InputLimits.lenient_parameters``); a known field of the wrong type
or out of range is InvalidRequest naming the parameter ("messages[0].content"), and so is any
string past ``InputLimits`` or holding a lone surrogate.  ``app_metadata`` may sit at the
top level (the OpenAI SDK merges ``extra_body`` there) or, for clients that nest it literally,
under ``extra_body``.

Contract of ``GenerationBody.structure``: what the body asks of the output beyond sampling --
tools, a tool choice, one output constraint -- as ``core.structured`` values, or InvalidRequest
naming the parameter (two constraints, a constraint beside tools the model may call, a tool
choice naming no tool).  docs/openai-api.md lists the rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NamedTuple, TypeVar

from pydantic import Field, ValidationError, WithJsonSchema, field_validator

from clairvoyant.core.app_metadata import ID_PATTERN, OPTIONAL_IDS, REQUIRED
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.json_input import check_strings, format_param
from clairvoyant.core.openai_messages import ChatMessageIn, Strict, ToolIn

# The worker's own endpoint answers in these shapes and imports them from here, beside the bodies.
from clairvoyant.core.openai_output import AssistantMessage as AssistantMessage
from clairvoyant.core.openai_output import ChatChoice as ChatChoice
from clairvoyant.core.openai_output import ChatChunkChoice as ChatChunkChoice
from clairvoyant.core.openai_output import ChatChunkOut as ChatChunkOut
from clairvoyant.core.openai_output import ChatCompletionOut as ChatCompletionOut
from clairvoyant.core.openai_output import ChatDelta as ChatDelta
from clairvoyant.core.openai_output import ModelCard as ModelCard
from clairvoyant.core.openai_output import ModelList as ModelList
from clairvoyant.core.openai_output import TextChoice as TextChoice
from clairvoyant.core.openai_output import TextCompletionOut as TextCompletionOut
from clairvoyant.core.openai_output import UsageOut as UsageOut
from clairvoyant.core.openai_parameters import Api, check_parameters
from clairvoyant.core.openai_structure import (
    JSON_TEXT_OR_OBJECT_SCHEMA,
    RESPONSE_FORMAT_SCHEMA,
    TOOL_CHOICE_SCHEMA,
    Structure,
    one_constraint,
    parse_response_format,
    parse_tool_choice,
    structured_outputs,
)
from clairvoyant.core.structured import OutputConstraint, ToolCall, ToolChoice


class InputLimits(NamedTuple):
    """What a decoded body may hold (the gateway's ``max_string_chars`` and friends)."""

    max_string_chars: int = 524_288
    max_messages: int = 2048
    max_stop_sequences: int = 4
    lenient_parameters: bool = False  # unknown top-level fields are dropped instead of refused


DEFAULT_LIMITS = InputLimits()
MAX_CHOICES = 8  # n: each choice holds a sequence's KV blocks on one worker (OpenAI allows 128)
MAX_TOOLS = 128  # OpenAI's limit

# The JSON schemas of body fields validated by hand (for a clean error location), for /openapi.json.
STOP_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}},
            {"type": "null"},
        ],
        "description": "up to CV_MAX_STOP_SEQUENCES (default 4) stop sequences",
    }
)
PROMPT_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
        ]
    }
)

_ID = {"type": "string", "pattern": ID_PATTERN.pattern}
APP_METADATA_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    **{name: _ID for name in (*REQUIRED, *OPTIONAL_IDS)},
                    "parent_request_ids": {"type": "array", "items": _ID},
                    "workflow_end": {"type": "boolean"},
                },
                "required": list(REQUIRED),
                "additionalProperties": False,
            },
            {"type": "null"},
        ]
    }
)


@dataclass(frozen=True)
class ChatTurn:
    role: str  # system | user | assistant | tool
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers


class StreamOptions(Strict):
    include_usage: bool | None = None


class GenerationBody(Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    api: ClassVar[Api]  # whose parameter table applies
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: Annotated[Any, STOP_SCHEMA] = None  # a string or a list of them (checked below)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # an int64 on the wire
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)  # vLLM's and SGLang's extension
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    user: str | None = None  # accepted and ignored: the tenant comes from the API key
    app_metadata: Annotated[Any, APP_METADATA_SCHEMA] = None  # validated by parse_app_metadata
    echo_annotations: bool | None = None
    # vLLM's and SGLang's constrained decoding (at most one constraint; see ``structure``).
    guided_json: Annotated[Any, JSON_TEXT_OR_OBJECT_SCHEMA] = None
    guided_regex: str | None = Field(default=None, min_length=1)
    guided_choice: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = Field(default=None, min_length=1)
    structural_tag: Annotated[Any, JSON_TEXT_OR_OBJECT_SCHEMA] = None
    structured_outputs: dict[str, Any] | None = None

    @field_validator("guided_json", "structural_tag")
    @classmethod
    def _json_object(cls, value: Any) -> dict[str, Any] | None:
        """An object, or its JSON text (vLLM takes both)."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object or its JSON text") from None
        if value is not None and not isinstance(value, dict):
            raise ValueError("must be a JSON object or its JSON text")
        return value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        stops = [value] if isinstance(value, str) else value if value is not None else []
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError("must be a non-empty string or a list of them")
        return tuple(stops)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids (decimal strings), got {key[:40]!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"values must be in [-100, 100], got {bias} for token {key}")
        return value

    def logit_biases(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as (token id, bias) pairs, in token order."""
        return tuple(sorted((int(key), float(bias)) for key, bias in (self.logit_bias or {}).items()))

    def choices(self) -> int:
        return self.n or 1

    def constraints(self) -> list[tuple[str, OutputConstraint]]:
        """(parameter, constraint) for every constraint the body asks for, in the order a conflict
        between two of them is reported (the second one named)."""
        found: list[tuple[str, OutputConstraint]] = []
        if self.guided_json is not None:
            found.append(("guided_json", OutputConstraint.of_schema(self.guided_json)))
        if self.guided_regex is not None:
            found.append(("guided_regex", OutputConstraint("regex", self.guided_regex)))
        if self.guided_choice is not None:
            found.append(("guided_choice", OutputConstraint("choice", json.dumps(self.guided_choice))))
        if self.guided_grammar is not None:
            found.append(("guided_grammar", OutputConstraint("ebnf", self.guided_grammar)))
        if self.structural_tag is not None:
            found.append(("structural_tag", OutputConstraint("structural_tag", json.dumps(self.structural_tag))))
        if self.structured_outputs is not None:
            found += structured_outputs(self.structured_outputs)
        return found

    def structure(self) -> Structure:
        """What the body asks of the output's shape; InvalidRequest for two constraints at once."""
        return Structure(constraint=one_constraint(self.constraints()))

    def structured_params(self) -> list[str]:
        """The parameters set that ask for more than plain sampling (several choices, tools, an output
        constraint), for an endpoint that serves plain sampling only (a worker's own) to refuse."""
        asked = ["n"] if self.choices() > 1 else []
        return asked + [name.partition(".")[0] for name, _ in self.constraints()]

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    def requested_logprobs(self) -> int | None:
        """None: no log probabilities; k: each token's and the top k alternatives'."""
        return None

    def token_counts(self, max_tokens_limit: int | None = None) -> tuple[int | None, int]:
        """(max_tokens, min_tokens) as asked (max_tokens None when unset).  InvalidRequest when
        either is past ``max_tokens_limit`` (None: no limit) or min_tokens exceeds max_tokens."""
        max_tokens, param = self.requested_max_tokens()
        if max_tokens_limit is not None and max_tokens is not None and max_tokens > max_tokens_limit:
            raise InvalidRequest(
                f"{param} must be at most {max_tokens_limit}", param=param, code="invalid_value"
            )
        min_tokens = self.min_tokens or 0
        if max_tokens_limit is not None and min_tokens > max_tokens_limit:
            raise InvalidRequest(
                f"min_tokens must be at most {max_tokens_limit}", param="min_tokens", code="invalid_value"
            )
        if max_tokens is not None and min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens must not exceed {param}", param="min_tokens", code="invalid_value"
            )
        return max_tokens, min_tokens

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionBody(GenerationBody):
    api: ClassVar[Api] = "chat"
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolIn] | None = None
    tool_choice: Annotated[Any, TOOL_CHOICE_SCHEMA] = None
    parallel_tool_calls: bool | None = None
    response_format: Annotated[Any, RESPONSE_FORMAT_SCHEMA] = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[ToolIn] | None) -> list[ToolIn] | None:
        names = [tool.function.name for tool in value or ()]
        if len(names) > MAX_TOOLS:
            raise ValueError(f"at most {MAX_TOOLS} tools are allowed, got {len(names)}")
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"function names must be unique; repeated: {twice}")
        return value


    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, value: Any) -> ToolChoice | None:
        return parse_tool_choice(value)

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: Any) -> OutputConstraint | None:
        return parse_response_format(value)


    def constraints(self) -> list[tuple[str, OutputConstraint]]:
        own = [("response_format", self.response_format)] if self.response_format is not None else []
        return own + super().constraints()

    def structured_params(self) -> list[str]:
        callable_tools = self.tools and (self.tool_choice is None or self.tool_choice.mode != "none")
        return (["tools"] if callable_tools else []) + super().structured_params()

    def structure(self) -> Structure:
        """Tools, the tool choice and the constraint.  InvalidRequest for a tool choice that names no
        tool (or asks for a call with no tools), and for a constraint beside tools the model may call:
        a call's arguments follow the tool's schema, not the response's."""
        constraint = one_constraint(self.constraints())
        tools = tuple(tool.spec() for tool in self.tools or ())
        choice: ToolChoice | None = self.tool_choice
        if choice is not None and choice.mode in ("required", "function") and not tools:
            raise InvalidRequest(
                f"tool_choice {choice.mode!r} needs tools", param="tool_choice", code="invalid_value"
            )
        if choice is not None and choice.mode == "function" and choice.name not in {t.name for t in tools}:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not one of the tools",
                param="tool_choice",
                code="invalid_value",
            )
        if not tools:
            return Structure(constraint=constraint)
        if constraint is not None and (choice is None or choice.mode != "none"):
            param = next(name for name, _ in self.constraints())
            raise InvalidRequest(
                f"{param} cannot be combined with tools the model may call; set tool_choice to \"none\" "
                "or leave one of them out",
                param=param,
                code="invalid_value",
            )
        parallel = True if self.parallel_tool_calls is None else self.parallel_tool_calls
        return Structure(constraint, tools, choice, parallel)

    def requested_logprobs(self) -> int | None:
        """The top alternatives per token when log probabilities are asked for, else None."""
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> tuple[int | None, str]:
        # The newer name wins: the OpenAI SDK sends it, older clients send max_tokens.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def turns(self) -> tuple[ChatTurn, ...]:
        """The messages as chat turns.  InvalidRequest for a missing content (but an assistant's),
        a tool turn without ``tool_call_id``, and call fields on a turn of another role."""
        turns = []
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":  # an assistant turn with tool calls has none
                param = f"messages[{i}].content"
                raise InvalidRequest(f"{param} is required", param=param, code="missing_required_parameter")
            if m.role == "tool" and m.tool_call_id is None:
                param = f"messages[{i}].tool_call_id"
                raise InvalidRequest(
                    f"{param} is required: a tool message answers a call", param=param, code="missing_required_parameter"
                )
            if m.tool_calls and m.role != "assistant":
                param = f"messages[{i}].tool_calls"
                raise InvalidRequest(f"{param}: only assistant messages make calls", param=param, code="invalid_value")
            if m.tool_call_id is not None and m.role != "tool":
                param = f"messages[{i}].tool_call_id"
                raise InvalidRequest(f"{param}: only tool messages answer calls", param=param, code="invalid_value")
            turns.append(
                ChatTurn(
                    # Chat templates know "system"; "developer" is OpenAI's newer name for it.
                    "system" if m.role == "developer" else m.role,
                    m.content or "",
                    m.name,
                    tuple(call.call() for call in m.tool_calls or ()),
                    m.tool_call_id,
                )
            )
        return tuple(turns)


class CompletionBody(GenerationBody):
    api: ClassVar[Api] = "completions"
    prompt: Annotated[Any, PROMPT_SCHEMA] = Field()  # required; a string or a list of exactly one
    logprobs: int | None = Field(default=None, ge=0, le=5)  # OpenAI's limit here

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise ValueError("must be a string or a list of exactly one string")
        if not value:
            raise ValueError("must not be empty")
        return value


Body = TypeVar("Body", bound=GenerationBody)


def validate_body(raw: object, model: type[Body], limits: InputLimits = DEFAULT_LIMITS) -> Body:
    """Validate a decoded JSON body.  Raises InvalidRequest naming the first offending parameter.

    Every string in the body, used or not, is checked first: a lone surrogate would otherwise only
    fail where the request is encoded for the worker, after it was scheduled."""
    check_strings(raw, limits.max_string_chars)
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object", code="invalid_body")
    nested = raw.get("extra_body")
    if nested is not None:
        if not isinstance(nested, dict):
            raise InvalidRequest("extra_body must be an object", param="extra_body", code="invalid_type")
        # Fields nested literally under extra_body count as top-level ones; the top level wins.
        raw = {**raw, **{k: v for k, v in nested.items() if raw.get(k) is None}}
    check_parameters(raw, model.api, lenient=limits.lenient_parameters)
    for param, most in (("messages", limits.max_messages), ("stop", limits.max_stop_sequences)):
        items = raw.get(param)
        if param in model.model_fields and isinstance(items, list) and len(items) > most:
            raise InvalidRequest(
                f"{param} has {len(items)} items; at most {most} are allowed",
                param=param,
                code="array_above_max_length",
            )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid_request(exc) from None


def invalid_request(exc: ValidationError) -> InvalidRequest:
    error = exc.errors(include_url=False)[0]
    param = format_param(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    kind = str(error["type"])
    if kind == "missing":
        return InvalidRequest(f"{param} is required", param=param, code="missing_required_parameter")
    code = "invalid_type" if kind.endswith("_type") or kind == "model_type" else "invalid_value"
    return InvalidRequest(f"invalid {param}: {message}", param=param, code=code)
