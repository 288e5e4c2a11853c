"""A gateway result in the OpenAI response shapes (``clairvoyant.core.openai_schema``):
chat.completion and text_completion, with the profiler's annotations when asked for."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.openai_schema import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionOut,
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TextChoice,
    TextCompletionOut,
    TopLogprobOut,
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


def chat_completion(result: CompletionResult, echo_annotations: bool) -> ChatCompletionOut:
    logprobs = None if result.logprobs is None else chat_logprobs(result.logprobs)
    return ChatCompletionOut(
        id=chat_id(result.request_id),
        created=result.created,
        model=result.model,
        choices=[
            ChatChoice(
                message=AssistantMessage(content=result.text), finish_reason=result.finish_reason, logprobs=logprobs
            )
        ],
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
                text=result.text, finish_reason=result.finish_reason,
                logprobs=None if result.logprobs is None else completion_logprobs(result.logprobs),
            )
        ],  # fmt: skip
        usage=usage_out(result.usage),
        annotations=annotations_dict(result.annotations) if echo_annotations else None,
    )
