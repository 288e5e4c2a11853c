"""A gateway result in the OpenAI response shapes (``clairvoyant.core.openai_schema``):
chat.completion and text_completion, with the profiler's annotations when asked for.

Every choice (``n``) in index order; a chat choice's calls in ``message.tool_calls``, with
``content`` null when the model wrote nothing beside them (as OpenAI answers).  The usage
counts every choice's tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.openai_output import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionOut,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TextChoice,
    TextCompletionOut,
    ToolCallOut,
    TopLogprobOut,
    UsageOut,
    chat_id,
    completion_id,
)
from clairvoyant.gateway.request import Choice, CompletionResult, TokenUsage


def usage_out(usage: TokenUsage) -> UsageOut:
    return UsageOut.of(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def annotations_dict(annotations: common_pb2.SysAnnotations | None) -> dict[str, Any]:
    """The profiler's annotations as JSON (empty when the request went un-annotated)."""
    if annotations is None:
        return {}
    return MessageToDict(annotations, preserving_proto_field_name=True)


def _top(token: str, logprob: float) -> TopLogprobOut:
    return TopLogprobOut(token=token, logprob=logprob, bytes=list(token.encode()))


def chat_logprobs(logprobs: Sequence[common_pb2.TokenLogprob]) -> ChatLogprobs:
    """OpenAI's chat ``logprobs``: one entry per token, with its text's UTF-8 bytes."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=lp.token, logprob=lp.logprob, bytes=list(lp.token.encode()),
                top_logprobs=[_top(top.token, top.logprob) for top in lp.top],
            )
            for lp in logprobs
        ]
    )  # fmt: skip


def completion_logprobs(logprobs: Sequence[common_pb2.TokenLogprob], offset: int = 0) -> CompletionLogprobs:
    """The legacy completions ``logprobs``; ``text_offset`` counts characters from the start of the
    completion's text (``offset``: the characters streamed before these tokens)."""
    offsets = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.token)
    return CompletionLogprobs(
        tokens=[lp.token for lp in logprobs],
        token_logprobs=[lp.logprob for lp in logprobs],
        top_logprobs=[{top.token: top.logprob for top in lp.top} for lp in logprobs],
        text_offset=offsets,
    )


def choices_of(result: CompletionResult) -> tuple[Choice, ...]:
    """The result's choices (a result built with the first choice's fields only stands for one)."""
    if result.choices:
        return result.choices
    return (
        Choice(0, result.text, result.finish_reason, result.logprobs, result.stop_sequence, result.tool_calls),
    )


def assistant_message(choice: Choice) -> AssistantMessage:
    if not choice.tool_calls:
        return AssistantMessage(content=choice.text)
    return AssistantMessage(
        content=choice.text or None, tool_calls=[ToolCallOut.of(call) for call in choice.tool_calls]
    )


def chat_completion(result: CompletionResult, echo_annotations: bool) -> ChatCompletionOut:
    return ChatCompletionOut(
        id=chat_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[
            ChatChoice(
                index=choice.index, message=assistant_message(choice), finish_reason=choice.finish_reason,
                logprobs=None if choice.logprobs is None else chat_logprobs(choice.logprobs),
            )
            for choice in choices_of(result)
        ],  # fmt: skip
        usage=usage_out(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )


def text_completion(result: CompletionResult, echo_annotations: bool) -> TextCompletionOut:
    return TextCompletionOut(
        id=completion_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[
            TextChoice(
                index=choice.index, text=choice.text, finish_reason=choice.finish_reason,
                logprobs=None if choice.logprobs is None else completion_logprobs(choice.logprobs),
            )
            for choice in choices_of(result)
        ],  # fmt: skip
        usage=usage_out(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )
