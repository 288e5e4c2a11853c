"""Server-sent events for streamed completions, in OpenAI's chunk formats.

    data: {chunk}\\n\\n      first (chat: role "assistant", one per choice), one per delta, then each
                         choice's last, with its finish_reason (the request's last: the annotations)
    data: {usage chunk}    only with stream_options.include_usage: empty choices, the usage
    data: [DONE]

Every chunk holds one choice, tagged with its ``index`` (``n`` > 1 interleaves them).  A chat
delta carries text, or tool-call pieces in OpenAI's form (``tool_call_deltas``), or both.

A failure after the status line has gone out can only travel as an event: ``data: {"error": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.core.openai_output import (
    ChatChunkChoice,
    ChatChunkOut,
    ChatDelta,
    ChatLogprobs,
    CompletionLogprobs,
    FunctionDeltaOut,
    TextChoice,
    TextCompletionOut,
    ToolCallDeltaOut,
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


def tool_call_deltas(deltas: Sequence[common_pb2.ToolCallDelta]) -> list[ToolCallDeltaOut] | None:
    """OpenAI's ``delta.tool_calls``: a call's first piece with its id, type and name, later ones
    with an arguments fragment only."""
    if not deltas:
        return None
    return [
        ToolCallDeltaOut(
            index=d.index, id=d.id or None, type="function" if d.id else None,
            function=FunctionDeltaOut(name=d.name or None, arguments=d.arguments),
        )
        for d in deltas
    ]  # fmt: skip


async def chat_events(generation: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    request = generation.request

    wants_logprobs = request.sampling.logprobs is not None

    def chunk(
        index: int,
        delta: ChatDelta,
        finish_reason: str | None = None,
        *,
        logprobs: ChatLogprobs | None = None,
        **extra: Any,
    ) -> bytes:
        choice = ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)
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
        for index in range(request.sampling.n):
            yield chunk(index, ChatDelta(role="assistant", content=""))
        async for piece in generation.chunks():
            if piece.text or piece.logprobs or piece.tool_calls:
                delta = ChatDelta(
                    content=piece.text if piece.text or not piece.tool_calls else None,
                    tool_calls=tool_call_deltas(piece.tool_calls),
                )
                logprobs = chat_logprobs(piece.logprobs) if wants_logprobs else None
                yield chunk(piece.choice, delta, logprobs=logprobs)
            if piece.finish_reason is not None:
                yield chunk(piece.choice, ChatDelta(), piece.finish_reason, **_echo(generation))
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


def _echo(generation: Generation) -> dict[str, Any]:
    """The annotations, for the request's last chunk when it asked for them (else nothing)."""
    if not generation.request.echo_annotations or generation.finish_reason is None:
        return {}
    return {"annotations": annotations_dict(generation.annotations)}


async def text_events(generation: Generation, include_usage: bool) -> AsyncIterator[bytes]:
    request = generation.request

    wants_logprobs = request.sampling.logprobs is not None
    offsets: dict[int, int] = {}  # choice -> characters of its text streamed so far

    def chunk(
        index: int, text: str, finish_reason: str | None = None, *, logprobs: CompletionLogprobs | None = None,
        **extra: Any,
    ) -> bytes:
        choice = TextChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)
        return event(
            TextCompletionOut(
                id=completion_id(request.request_id),
                created=generation.created,
                model=request.model,
                choices=[choice],
                **extra,
            )
        )  # fmt: skip

    try:
        async for piece in generation.chunks():
            if piece.text or piece.logprobs:
                offset = offsets.get(piece.choice, 0)
                logprobs = completion_logprobs(piece.logprobs, offset) if wants_logprobs else None
                yield chunk(piece.choice, piece.text, logprobs=logprobs)
                offsets[piece.choice] = offset + sum(len(lp.token) for lp in piece.logprobs)
            if piece.finish_reason is not None:
                yield chunk(piece.choice, "", piece.finish_reason, **_echo(generation))
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
