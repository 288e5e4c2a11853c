"""Server-sent events for streamed completions, in OpenAI's chunk formats.

    data: {chunk}\\n\\n      first (chat: role "assistant"), one per text delta, last with finish_reason
    data: {usage chunk}    only with stream_options.include_usage: empty choices, the usage
    data: [DONE]

A failure after the status line has gone out can only travel as an event: ``data: {"error": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.core.openai_schema import (
    ChatChunkChoice,
    ChatChunkOut,
    ChatDelta,
    ChatLogprobs,
    CompletionLogprobs,
    TextChoice,
    TextCompletionOut,
    chat_id,
    completion_id,
)
from clairvoyant.gateway.generation import Generation
from clairvoyant.gateway.responses import annotations_dict, chat_logprobs, completion_logprobs, usage_out

DONE = b"data: [DONE]\n\n"


def event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One event: ``data: <json>`` and a blank line."""
    if isinstance(payload, BaseModel):
        return b"data: " + payload.model_dump_json().encode() + b"\n\n"
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def chat_events(generation: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    request = generation.request

    wants_logprobs = request.sampling.logprobs is not None

    def chunk(
        delta: ChatDelta, finish_reason: str | None = None, *, logprobs: ChatLogprobs | None = None, **extra: Any
    ) -> bytes:
        choice = ChatChunkChoice(delta=delta, finish_reason=finish_reason, logprobs=logprobs)
        return event(
            ChatChunkOut(
                id=chat_id(request.request_id),
                created=generation.created,
                model=request.model,
                choices=[choice],
                **extra,
            )
        )

    try:
        yield chunk(ChatDelta(role="assistant", content=""))
        async for text, logprobs in generation.pieces():
            yield chunk(ChatDelta(content=text), logprobs=chat_logprobs(logprobs) if wants_logprobs else None)
        echo: dict[str, Any] = (
            {"annotations": annotations_dict(generation.annotations)} if request.echo_annotations else {}
        )
        yield chunk(ChatDelta(), generation.finish_reason, **echo)
        if include_usage:
            yield event(
                ChatChunkOut(
                    id=chat_id(request.request_id),
                    created=generation.created,
                    model=request.model,
                    choices=[],
                    usage=usage_out(generation.usage),
                )
            )
        yield DONE
    except ClairvoyantError as err:
        yield event(err.to_openai())
        yield DONE
    finally:
        await generation.close()


async def text_events(generation: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    request = generation.request

    wants_logprobs = request.sampling.logprobs is not None
    offset = 0  # characters of the completion's text streamed so far

    def chunk(
        text: str, finish_reason: str | None = None, *, logprobs: CompletionLogprobs | None = None, **extra: Any
    ) -> bytes:
        choice = TextChoice(text=text, finish_reason=finish_reason, logprobs=logprobs)
        return event(
            TextCompletionOut(
                id=completion_id(request.request_id),
                created=generation.created,
                model=request.model,
                choices=[choice],
                **extra,
            )
        )

    try:
        async for text, logprobs in generation.pieces():
            yield chunk(text, logprobs=completion_logprobs(logprobs, offset) if wants_logprobs else None)
            offset += sum(len(lp.token) for lp in logprobs)
        echo: dict[str, Any] = (
            {"annotations": annotations_dict(generation.annotations)} if request.echo_annotations else {}
        )
        yield chunk("", generation.finish_reason, **echo)
        if include_usage:
            yield event(
                TextCompletionOut(
                    id=completion_id(request.request_id),
                    created=generation.created,
                    model=request.model,
                    choices=[],
                    usage=usage_out(generation.usage),
                )
            )
        yield DONE
    except ClairvoyantError as err:
        yield event(err.to_openai())
        yield DONE
    finally:
        await generation.close()
