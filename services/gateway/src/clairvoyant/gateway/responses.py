"""A gateway result in the OpenAI response shapes (``clairvoyant.core.openai_schema``):
chat.completion and text_completion, with the profiler's annotations when asked for."""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionOut,
    TextChoice,
    TextCompletionOut,
    UsageOut,
    chat_id,
    completion_id,
)
from clairvoyant.gateway.request import CompletionResult, TokenUsage


def usage_out(usage: TokenUsage) -> UsageOut:
    return UsageOut.of(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


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
        usage=usage_out(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )


def text_completion(result: CompletionResult, echo_annotations: bool) -> TextCompletionOut:
    return TextCompletionOut(
        id=completion_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[TextChoice(text=result.text, finish_reason=result.finish_reason)],
        usage=usage_out(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )
