"""The OpenAI API's request bodies and response shapes, one schema for every HTTP edge that speaks
it (the gateway, and the worker's own endpoint).  Pydantic only: no transport, no service types.

Contract of ``validate_body``: a top-level field is held to ``openai_parameters``' table first
(a refused parameter is InvalidRequest ``unsupported_parameter``; an unknown one is
``unknown_parameter`` unless ``InputLimits.lenient_parameters``); a known field of the wrong type
or out of range is InvalidRequest naming the parameter ("messages[0].content"), and so is any
string past ``InputLimits`` or holding a lone surrogate.  ``app_metadata`` may sit at the
top level (the OpenAI SDK merges ``extra_body`` there) or, for clients that nest it literally,
under ``extra_body``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from clairvoyant.core.app_metadata import ID_PATTERN, OPTIONAL_IDS, REQUIRED
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.json_input import check_strings, format_param
from clairvoyant.core.openai_parameters import Api, check_parameters
from clairvoyant.core.structured import ToolCall


class InputLimits(NamedTuple):
    """What a decoded body may hold (the gateway's ``max_string_chars`` and friends)."""

    max_string_chars: int = 524_288
    max_messages: int = 2048
    max_stop_sequences: int = 4
    lenient_parameters: bool = False  # unknown top-level fields are dropped instead of refused


DEFAULT_LIMITS = InputLimits()

# The JSON schemas of body fields validated by hand (for a clean error location), for /openapi.json.
_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
CONTENT_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]}
)
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


class _Strict(BaseModel):
    # strict: "0.5" is not a number and 1 is not true; extra="ignore": what check_parameters let
    # through without a field here (ignored parameters, refused ones that ask for nothing) is dropped.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class ChatMessageIn(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Annotated[Any, CONTENT_SCHEMA] = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str | None:
        """A string, or a list of ``{"type": "text", "text": ...}`` parts (joined); null stays null."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"part {i} must be {{'type': 'text', 'text': <string>}}; only text is supported, got {kind!r}"
                )
            texts.append(part["text"])
        return "".join(texts)


class GenerationBody(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    api: ClassVar[Api]  # whose parameter table applies
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: Annotated[Any, STOP_SCHEMA] = None  # a string or a list of them (checked below)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # an int64 on the wire
    n: int | None = None
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

    @field_validator("n")
    @classmethod
    def _n(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported")
        return value

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
        """The messages as chat turns.  InvalidRequest for a missing content (but an assistant's)."""
        turns = []
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":  # an assistant turn with tool calls has none
                param = f"messages[{i}].content"
                raise InvalidRequest(f"{param} is required", param=param, code="missing_required_parameter")
            # Chat templates know "system"; "developer" is OpenAI's newer name for it.
            turns.append(ChatTurn("system" if m.role == "developer" else m.role, m.content or "", m.name))
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


# Responses.


def _unset(value: object) -> bool:
    return value is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> UsageOut:
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprobOut(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(TopLogprobOut):
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None
    refusal: None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: ChatLogprobs | None = None


class ChatCompletionOut(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageOut
    annotations: dict[str, Any] | None = Field(default=None, exclude_if=_unset)  # only when echo_annotations


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_unset)
    content: str | None = Field(default=None, exclude_if=_unset)


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatChunkOut(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageOut | None = Field(default=None, exclude_if=_unset)
    annotations: dict[str, Any] | None = Field(default=None, exclude_if=_unset)


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class TextCompletionOut(BaseModel):
    """Both the whole answer and each streamed chunk of /v1/completions."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageOut | None = Field(default=None, exclude_if=_unset)
    annotations: dict[str, Any] | None = Field(default=None, exclude_if=_unset)


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "clairvoyant"
    max_model_len: int | None = Field(default=None, exclude_if=_unset)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorObject(BaseModel):
    message: str
    type: str  # invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
    param: str | None  # the offending parameter, as OpenAI names it: "messages[0].content"
    code: str | None  # machine-readable: "invalid_value", "context_length_exceeded", ...


class ErrorOut(BaseModel):
    """Every refusal and failure, whatever its status."""

    error: ErrorObject


def chat_id(request_id: str) -> str:
    return f"chatcmpl-{request_id}"


def completion_id(request_id: str) -> str:
    return f"cmpl-{request_id}"
