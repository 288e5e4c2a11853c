"""The streamed answer of ``POST /v1/messages``: Anthropic's server-sent events (``message_start``,
the content-block events, ``message_delta``, ``message_stop``; ``error`` when it fails).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.gateway.anthropic_response import (
    MessageOut,
    MessageUsage,
    error_out,
    message_id,
    stop_reason,
    tool_use_id,
)
from clairvoyant.gateway.generation import Generation, Piece


def event(name: str, payload: BaseModel | dict[str, Any]) -> bytes:
    """One server-sent event: ``event: <name>``, ``data: <json>`` and a blank line."""
    data = (
        payload.model_dump_json()
        if isinstance(payload, BaseModel)
        else json.dumps(payload, separators=(",", ":"))
    )
    return f"event: {name}\ndata: {data}\n\n".encode()


class ContentEvents:
    """The content-block events of one choice's pieces, in Anthropic's order: a text block while
    text arrives, a tool_use block per call (opened by the call's first piece, with ``input: {}``;
    each argument fragment an ``input_json_delta``).  One block is open at a time: a new one closes
    it, so the text block closes before the first tool_use block opens.  ``ping`` follows the first
    ``content_block_start``, as Anthropic sends it.

        index:  0 text   1 tool_use (call 0)   2 tool_use (call 1)
        events: start delta* stop | start json* stop | start json* stop

    Arguments stream as the engine makes them (the worker's grammar keeps them a JSON object)."""

    def __init__(self) -> None:
        self.blocks = 0  # blocks started so far; the next one's index
        self.open: str | None = None  # the open block's type
        self.uses: dict[int, int] = {}  # call index -> its block's index

    @property
    def called(self) -> bool:
        return bool(self.uses)

    def feed(self, piece: Piece) -> list[bytes]:
        out: list[bytes] = []
        if piece.text:
            if self.open != "text":
                out += self._start({"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": piece.text}))
        for delta in piece.tool_calls:
            if delta.index not in self.uses:
                block = {"type": "tool_use", "id": tool_use_id(delta.id), "name": delta.name, "input": {}}
                out += self._start(block)
                self.uses[delta.index] = self.blocks - 1
            if delta.arguments:
                fragment = {"type": "input_json_delta", "partial_json": delta.arguments}
                out.append(self._delta(fragment, self.uses[delta.index]))
        return out

    def finish(self) -> list[bytes]:
        """Close the open block; an answer with no content still gets its (empty) text block."""
        out = [] if self.blocks else self._start({"type": "text", "text": ""})
        return out + self._close()

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        out.append(
            event(
                "content_block_start",
                {"type": "content_block_start", "index": self.blocks, "content_block": block},
            )
        )
        if self.blocks == 0:
            out.append(event("ping", {"type": "ping"}))
        self.blocks += 1
        self.open = block["type"]
        return out

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.blocks - 1})]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> bytes:
        index = self.blocks - 1 if index is None else index
        return event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


async def message_events(generation: Generation) -> AsyncIterator[bytes]:
    """The stream: message_start, the content blocks (``ContentEvents``), message_delta
    (stop_reason, usage), message_stop; an ``error`` event ends it when the generation fails.
    message_start waits for the first piece, which carries the prompt's token count."""
    request = generation.request
    try:
        pieces = generation.chunks()
        first = await anext(pieces, None)
        start = MessageOut(
            id=message_id(request.request_id),
            model=request.model,
            content=[],
            stop_reason=None,
            usage=MessageUsage.of(generation.usage),
        )
        yield event("message_start", {"type": "message_start", "message": start.model_dump()})
        blocks = ContentEvents()
        if first is not None:
            for data in blocks.feed(first):
                yield data
            async for piece in pieces:
                for data in blocks.feed(piece):
                    yield data
        for data in blocks.finish():
            yield data
        assert generation.finish_reason is not None, "chunks() ends only once the worker finished"
        matched = generation.stop_sequence
        reason = stop_reason(generation.finish_reason, matched, called=blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": matched}
        usage = MessageUsage.of(generation.usage).model_dump()
        yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        yield event("message_stop", {"type": "message_stop"})
    except ClairvoyantError as err:
        yield event("error", error_out(err))
    finally:
        await generation.close()
