"""The OpenAI request bodies, validated strictly, and their conversion to a ``GenerationRequest``.

Unknown fields are ignored, as OpenAI does; a known field of the wrong type or out of range is a
400 naming the parameter, and so is any string past ``InputLimits`` or holding a lone surrogate.
``app_metadata`` may sit at the top level (the OpenAI SDK merges ``extra_body`` there) or, for
clients that nest it literally, under ``extra_body``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clairvoyant.core.app_metadata import parse_app_metadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.gateway.json_input import check_strings, format_param
from clairvoyant.gateway.openapi_doc import APP_METADATA_SCHEMA, CONTENT_SCHEMA, PROMPT_SCHEMA, STOP_SCHEMA
from clairvoyant.gateway.request import ChatTurn, Endpoint, GenerationRequest, Sampling


class InputLimits(NamedTuple):
    """Caps on a decoded body (GatewaySettings' ``max_string_chars`` and friends)."""

    max_string_chars: int = 524_288
    max_messages: int = 2048
    max_stop_sequences: int = 4


DEFAULT_LIMITS = InputLimits()


class _Strict(BaseModel):
    # strict: "0.5" is not a number and 1 is not true; extra="ignore": OpenAI fields we do not use pass.
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


class _GenerationBody(_Strict):
    """Fields shared by /v1/chat/completions and /v1/completions."""

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

    @field_validator("n")
    @classmethod
    def _n(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported")
        return value

    def requested_max_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"

    def sampling(self, max_tokens_limit: int) -> Sampling:
        max_tokens, param = self.requested_max_tokens()
        if max_tokens is not None and max_tokens > max_tokens_limit:
            raise InvalidRequest(
                f"{param} must be at most {max_tokens_limit}", param=param, code="invalid_value"
            )
        min_tokens = self.min_tokens or 0
        if min_tokens > max_tokens_limit:
            raise InvalidRequest(
                f"min_tokens must be at most {max_tokens_limit}", param="min_tokens", code="invalid_value"
            )
        if max_tokens is not None and min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens must not exceed {param}", param="min_tokens", code="invalid_value"
            )
        return Sampling(
            max_tokens,
            self.temperature,
            self.top_p,
            self.seed,
            tuple(self.stop or ()),
            bool(self.ignore_eos),
            min_tokens,
        )

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatCompletionBody(_GenerationBody):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def requested_max_tokens(self) -> tuple[int | None, str]:
        # The newer name wins: the OpenAI SDK sends it, older clients send max_tokens.
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def turns(self) -> tuple[ChatTurn, ...]:
        turns = []
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":  # an assistant turn with tool calls has none
                param = f"messages[{i}].content"
                raise InvalidRequest(f"{param} is required", param=param, code="missing_required_parameter")
            # Chat templates know "system"; "developer" is OpenAI's newer name for it.
            turns.append(ChatTurn("system" if m.role == "developer" else m.role, m.content or "", m.name))
        return tuple(turns)


class CompletionBody(_GenerationBody):
    prompt: Annotated[Any, PROMPT_SCHEMA] = Field()  # required; a string or a list of exactly one

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


Body = TypeVar("Body", bound=_GenerationBody)


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


def to_request(
    body: ChatCompletionBody | CompletionBody,
    *,
    tenant: str,
    endpoint: Endpoint,
    request_id: str,
    arrival_time: float,
    max_tokens_limit: int,
) -> GenerationRequest:
    meta = parse_app_metadata(body.app_metadata) if body.app_metadata is not None else None
    return GenerationRequest(
        request_id=request_id,
        tenant=tenant,
        endpoint=endpoint,
        model=body.model,
        sampling=body.sampling(max_tokens_limit),
        arrival_time=arrival_time,
        chat=body.turns() if isinstance(body, ChatCompletionBody) else None,
        prompt=body.prompt if isinstance(body, CompletionBody) else None,
        app_metadata=meta,
        stream=bool(body.stream),
        echo_annotations=bool(body.echo_annotations),
    )
