"""The OpenAI API's response shapes: chat and text completions, whole and streamed, their choices,
log probabilities, tool calls and usage, the model list, the error object, and the ids an answer
carries (``chat_id``, ``completion_id``).  Pydantic only, as ``openai_schema``; every HTTP edge
that speaks the API answers in them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clairvoyant.core.structured import ToolCall


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


class FunctionOut(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionOut

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallOut:
        return cls(id=call.id, function=FunctionOut(name=call.name, arguments=call.arguments))


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # null when the answer is only tool calls
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=_unset)


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


class FunctionDeltaOut(BaseModel):
    name: str | None = Field(default=None, exclude_if=_unset)  # on the call's first piece
    arguments: str = ""  # a fragment of the arguments' JSON text


class ToolCallDeltaOut(BaseModel):
    """A streamed piece of a call: the first carries ``id``, ``type`` and the name, later ones
    append to the arguments of the call at ``index``."""

    index: int
    id: str | None = Field(default=None, exclude_if=_unset)
    type: Literal["function"] | None = Field(default=None, exclude_if=_unset)
    function: FunctionDeltaOut


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_unset)
    content: str | None = Field(default=None, exclude_if=_unset)
    tool_calls: list[ToolCallDeltaOut] | None = Field(default=None, exclude_if=_unset)


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
