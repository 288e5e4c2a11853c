"""The streaming tool-call parser: detokenized text in, content and call pieces out.

``ToolCallParser.feed`` takes the text in the pieces it arrives in and returns the content outside
calls plus ``CallDelta`` pieces (OpenAI's streamed ``tool_calls`` shape); the concatenated argument
fragments of a call equal its arguments' JSON text exactly (a raw control character inside a
string escaped), however the text was split.  A call that does not parse is handed back as text,
never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.structured import new_call_id
from clairvoyant.worker.tools.formats import JsonValueEnd, ToolFormat, escape_control


@dataclass(frozen=True)
class CallDelta:
    """A piece of call ``index``: the first carries ``id`` and ``name``, the rest argument text."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class Parsed(NamedTuple):
    text: str  # content outside calls, released by this piece
    calls: tuple[CallDelta, ...]  # call pieces released by this piece


@dataclass
class _Call:
    """The call being read: its header (before the arguments), then its arguments."""

    index: int
    layout: str = ""  # the whitespace before it, given back with its text if it is no call
    header: str = ""
    name: str | None = None  # set once the header parsed: arguments stream from then on
    arguments: JsonValueEnd = field(default_factory=JsonValueEnd)
    arguments_done: bool = False
    tail: str = ""  # what follows the arguments, up to the end of the call


class ToolCallParser:
    """One choice's calls, parsed as its text streams in (see the module docstring).

    Whitespace before a call, between calls and after the last is layout, not content, and is
    dropped (with ``;`` between Llama calls); text outside calls is otherwise passed through
    unchanged, the whitespace that leads it after a call included.  ``feed`` and
    ``finish`` never raise: what does not parse as a call is returned as text.
    """

    def __init__(self, fmt: ToolFormat, new_id: Callable[[], str] = new_call_id) -> None:
        self.format = fmt
        self._new_id = new_id
        self._pending = ""  # outside a call: text held back (a possible start marker, whitespace)
        self._call: _Call | None = None
        self._after_call = False  # the last thing seen was a call: leading layout is dropped
        self.calls_made = 0

    def feed(self, text: str) -> Parsed:
        out: list[str] = []
        deltas: list[CallDelta] = []
        rest = text
        while rest:
            rest = self._outside(rest, out) if self._call is None else self._inside(rest, out, deltas)
        return Parsed("".join(out), tuple(deltas))

    def finish(self) -> Parsed:
        """The end of the text.  A call cut off (max_tokens) after its name stays a call, holding
        the arguments that streamed; one cut off before is handed back as text, as is held-back
        text that is not layout after a call."""
        text = ""
        call = self._call
        if call is not None:
            self._call = None
            if call.name is None:
                text = call.layout + self.format.start + call.header
            else:
                self.calls_made += 1
        elif not self._after_call or self._pending.strip(self.format.separators):
            text = self._pending
        self._pending = ""
        return Parsed(text, ())

    # -- outside a call

    def _outside(self, text: str, out: list[str]) -> str:
        buffer = self._pending + text
        if self._after_call:
            stripped = buffer.lstrip(self.format.separators)
            if not stripped:
                self._pending = buffer
                return ""
            # Layout before more content stays (its whitespace); before another call it is dropped below.
            layout = buffer[: len(buffer) - len(stripped)]
            buffer, self._after_call = "".join(c for c in layout if c.isspace()) + stripped, False
        found = self.format.find_start(buffer)
        if found is not None:
            start, end = found
            before = buffer[:start].rstrip()
            out.append(before)
            self._pending = ""
            self._call = _Call(index=self.calls_made, layout=buffer[len(before) : start])
            return buffer[end:] or ""
        # Hold back a possible start marker and trailing layout until the next piece resolves them.
        keep = self.format.partial_start(buffer)
        body = buffer[: len(buffer) - keep]
        stripped = body.rstrip()
        out.append(stripped)
        self._pending = buffer[len(stripped) :]
        return ""

    # -- inside a call

    def _inside(self, text: str, out: list[str], deltas: list[CallDelta]) -> str:
        call = self._call
        assert call is not None
        if call.name is None:
            call.header += text
            match = self.format.header.match(call.header)
            if match is None or match.end() == len(call.header):
                return self._unparsed(call, out, deltas)
            try:
                name = json.loads('"' + match.group(1) + '"')
            except ValueError:  # a control character in it: keep it as written
                name = match.group(1)
            call.name = name
            deltas.append(CallDelta(call.index, self._new_id(), name))
            text, call.header = call.header[match.end() :], call.header[: match.end()]
        if not call.arguments_done:
            fragment = []
            for position, char in enumerate(text):
                if call.arguments.feed(char):
                    call.arguments_done = True
                    if not call.arguments.scalar:
                        fragment.append(char)
                        position += 1
                    text = text[position:]
                    break
                # A raw control character inside a string is invalid JSON (xgrammar's bounded
                # strings let one through): it is written as its escape.
                fragment.append(escape_control(char) if call.arguments.in_string and char < " " else char)
            else:
                text = ""
            if fragment:
                deltas.append(CallDelta(call.index, arguments="".join(fragment)))
            if not call.arguments_done:
                return ""
        call.tail += text
        return self._close(call)

    def _close(self, call: _Call) -> str:
        """After the arguments: the wrapper's ``}`` and (hermes) the end marker close the call;
        anything else found there is content."""
        match = self.format.closing.match(call.tail)
        if match is not None:
            self._end_call()
            return call.tail[match.end() :]
        if self.format.closing_prefix.fullmatch(call.tail):
            return ""  # still possible: wait
        self._end_call()
        return call.tail  # not the call's end: content again

    def _unparsed(self, call: _Call, out: list[str], deltas: list[CallDelta]) -> str:
        """The header has not parsed (yet): wait for the end marker, then read the whole call as a
        JSON object (another key order, say), else hand its text back."""
        end = self.format.end_of_unparsed(call.header)
        if end is None:
            return ""
        body, rest = call.header[:end], call.header[end:]
        self._call = None
        whole = self.format.read_whole(body)
        if whole is None:
            out.append(call.layout + self.format.start + body)
            return rest
        name, arguments = whole
        deltas.append(CallDelta(call.index, self._new_id(), name, arguments))
        self._end_call()
        return rest

    def _end_call(self) -> None:
        self._call = None
        self._after_call = True
        self.calls_made += 1
