"""The OpenAI response shapes: chat.completion(.chunk), text_completion, the model list and the
error object."""

from __future__ import annotations

from typing import Any, Literal

from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, Field

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.gateway.request import CompletionResult, TokenUsage


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
    def of(cls, usage: TokenUsage) -> UsageOut:
        return cls(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.cached_tokens),
        )


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


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
    logprobs: None = None


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
    logprobs: None = None


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


def annotations_dict(annotations: common_pb2.SysAnnotations | None) -> dict[str, Any]:
    """The profiler's annotations as JSON (empty when the request went un-annotated)."""
    if annotations is None:
        return {}
    return MessageToDict(annotations, preserving_proto_field_name=True)


def chat_completion(result: CompletionResult, echo_annotations: bool) -> ChatCompletionOut:
    return ChatCompletionOut(
        id=chat_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[
            ChatChoice(message=AssistantMessage(content=result.text), finish_reason=result.finish_reason)
        ],
        usage=UsageOut.of(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )


def text_completion(result: CompletionResult, echo_annotations: bool) -> TextCompletionOut:
    return TextCompletionOut(
        id=completion_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[TextChoice(text=result.text, finish_reason=result.finish_reason)],
        usage=UsageOut.of(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )
