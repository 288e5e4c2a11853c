"""The streamed answer of ``POST /v1/responses``: OpenAI's Responses events, item by item
(``StreamedOutput``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from clairvoyant.core.structured import ToolCallPiece, new_call_id
from clairvoyant.gateway.responses_output import FunctionCallItem, MessageItem, OutputItem, OutputText


def sse(payload: dict[str, Any]) -> bytes:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class StreamedOutput:
    """Turns the worker's pieces into Responses events, keeping the items they build.

    One item is open at a time: text opens (or continues) a message, a tool-call piece with a new
    index opens a function call, and opening an item closes the one before.  Whitespace-only text
    waits until more text follows, so a newline beside tool calls makes no message of its own.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.items: list[OutputItem] = []
        self._sequence = 0
        self._open: OutputItem | None = None
        self._call_index: int | None = None  # the worker's index of the open call
        self._held_text = ""

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(payload)

    def text(self, text: str) -> list[bytes]:
        if not isinstance(self._open, MessageItem) and not (self._held_text + text).strip():
            self._held_text += text
            return []
        text, self._held_text = self._held_text + text, ""
        events = [] if isinstance(self._open, MessageItem) else self._open_message()
        return [*events, self._delta(text)]

    def call(self, piece: ToolCallPiece) -> list[bytes]:
        events = []
        if not isinstance(self._open, FunctionCallItem) or piece.index != self._call_index:
            events.extend(self.close())
            index = len(self.items)
            item = FunctionCallItem(
                id=f"fc_{self.request_id}_{index}", call_id=piece.id or new_call_id(), name=piece.name,
                arguments="", status="in_progress",
            )  # fmt: skip
            self.items.append(item)
            self._open, self._call_index = item, piece.index
            events.append(
                self.event("response.output_item.added", output_index=index, item=item.model_dump())
            )
        call = self._open
        assert isinstance(call, FunctionCallItem)
        if piece.name and not call.name:
            call.name = piece.name
        if piece.arguments:
            call.arguments += piece.arguments
            events.append(
                self.event(
                    "response.function_call_arguments.delta", item_id=call.id, output_index=len(self.items) - 1,
                    delta=piece.arguments,
                )
            )  # fmt: skip
        return events

    def finish(self, finish_reason: str) -> list[bytes]:
        """Close the open item (``incomplete`` when the token limit cut it); a response with no
        item gets an (empty) message, as a whole answer does."""
        events = []
        if not self.items:
            held, self._held_text = self._held_text, ""
            events = self._open_message()
            if held:
                events.append(self._delta(held))
        return events + self.close("incomplete" if finish_reason == "length" else "completed")

    def close(self, status: Literal["completed", "incomplete"] = "completed") -> list[bytes]:
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = status
        index = len(self.items) - 1
        if isinstance(item, MessageItem):
            part = item.content[0]
            return [
                self.event(
                    "response.output_text.done", item_id=item.id, output_index=index, content_index=0,
                    text=part.text, logprobs=[],
                ),
                self.event(
                    "response.content_part.done", item_id=item.id, output_index=index, content_index=0,
                    part=part.model_dump(),
                ),
                self.event("response.output_item.done", output_index=index, item=item.model_dump()),
            ]  # fmt: skip
        return [
            self.event(
                "response.function_call_arguments.done", item_id=item.id, output_index=index, name=item.name,
                arguments=item.arguments,
            ),
            self.event("response.output_item.done", output_index=index, item=item.model_dump()),
        ]  # fmt: skip

    def _open_message(self) -> list[bytes]:
        events = self.close()
        index = len(self.items)
        message = MessageItem(id=f"msg_{self.request_id}_{index}", status="in_progress", content=[])
        self.items.append(message)
        events.append(self.event("response.output_item.added", output_index=index, item=message.model_dump()))
        message.content.append(OutputText(text=""))
        events.append(
            self.event(
                "response.content_part.added", item_id=message.id, output_index=index, content_index=0,
                part=OutputText(text="").model_dump(),
            )
        )  # fmt: skip
        self._open = message
        return events

    def _delta(self, text: str) -> bytes:
        message = self._open
        assert isinstance(message, MessageItem), "text goes to an open message"
        message.content[0].text += text
        return self.event(
            "response.output_text.delta", item_id=message.id, output_index=len(self.items) - 1, content_index=0,
            delta=text, logprobs=[],
        )  # fmt: skip
