"""Prompt-composition templates, read: the parser for what the profiler writes.

The profiler (``profiler/core/templates.py``, ``describe``) says which earlier blocks an agent's
prompt is made of, e.g. ``${engineer[-1]:prompt:[0,$]}${engineer[-1]:response:[0,64]}${new}``.
Grammar and semantics: docs/profiler.md, "Prompt-composition templates".  ``parse`` turns the text
into a ``Template``; a text outside the grammar raises ``TemplateSyntaxError`` (a ``ValueError``)
naming the character position where reading stopped.  Filling a template from a workflow's history
is the cache manager's (``cachemgr/core/assembly.py``).
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

NEW = "${new}"

EndKind = Literal["blocks", "all", "all_but", "any"]
Part = Literal["prompt", "response", "static"]

# Agent ids are application ids (core.app_metadata.ID_PATTERN): ":" may occur in one, so a name
# runs up to the "[-" that starts its back-reference.
_AGENT = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}?(?=\[-)")
_INT = re.compile(r"[0-9]{1,9}")


class TemplateSyntaxError(ValueError):
    """A template outside the grammar; ``position`` is the offset where reading stopped."""

    def __init__(self, template: str, position: int, expected: str) -> None:
        super().__init__(f"template {template!r}: expected {expected} at position {position}")
        self.template = template
        self.position = position


class RangeEnd(NamedTuple):
    """The end of a ``[0,end]`` range, in blocks of the source's own chain.

    ``blocks``: ``value`` blocks; ``all`` (``$``): the whole source; ``all_but`` (``$-value``):
    all but the last ``value`` blocks; ``any`` (``*``): a prefix whose length varies."""

    kind: EndKind
    value: int = 0

    def text(self) -> str:
        return {"blocks": str(self.value), "all": "$", "all_but": f"$-{self.value}", "any": "*"}[self.kind]


class Segment(NamedTuple):
    """One ``${...}`` source: ``agent`` "" and ``part`` "static" for the agent's static prefix;
    else the ``back``-th most recent earlier call of ``agent`` (1 = the latest), its prompt or response."""

    agent: str
    back: int
    part: Part
    end: RangeEnd

    def text(self) -> str:
        if self.part == "static":
            return "${static:[0," + self.end.text() + "]}"
        return "${" + f"{self.agent}[-{self.back}]:{self.part}:[0,{self.end.text()}]" + "}"


class Template(NamedTuple):
    """A parsed template: its sources in order, then ``${new}``.  No segments: nothing is reused."""

    segments: tuple[Segment, ...]

    def text(self) -> str:
        return "".join(s.text() for s in self.segments) + NEW


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, expected: str) -> TemplateSyntaxError:
        return TemplateSyntaxError(self.text, self.pos, expected)

    def take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str) -> None:
        if not self.take(literal):
            raise self.fail(repr(literal))

    def match(self, pattern: re.Pattern[str], expected: str) -> str:
        found = pattern.match(self.text, self.pos)
        if found is None:
            raise self.fail(expected)
        self.pos = found.end()
        return found.group()

    def end(self) -> RangeEnd:
        if self.take("*"):
            return RangeEnd("any")
        if self.take("$-"):
            return RangeEnd("all_but", int(self.match(_INT, "a block count")))
        if self.take("$"):
            return RangeEnd("all")
        return RangeEnd("blocks", int(self.match(_INT, "a range end ($, $-d, * or a block count)")))

    def range(self) -> RangeEnd:
        self.expect("[0,")
        end = self.end()
        self.expect("]")
        return end

    def segment(self) -> Segment:
        if self.take("static:"):
            end = self.range()
            self.expect("}")
            return Segment("", 0, "static", end)
        agent = self.match(_AGENT, "an agent id followed by [-N]")
        self.expect("[-")
        back = int(self.match(_INT, "a positive call count"))
        if back < 1:
            self.pos -= 1
            raise self.fail("a positive call count")
        self.expect("]:")
        if self.take("prompt:"):
            part: Part = "prompt"
        elif self.take("response:"):
            part = "response"
        else:
            raise self.fail("'prompt:' or 'response:'")
        end = self.range()
        self.expect("}")
        return Segment(agent, back, part, end)


def parse(template: str) -> Template:
    """The template ``template`` spells; raises ``TemplateSyntaxError`` (a ``ValueError``)."""
    reader = _Reader(template)
    segments: list[Segment] = []
    while not reader.take(NEW):
        reader.expect("${")
        segments.append(reader.segment())
    if reader.pos != len(template):
        raise reader.fail("the end of the template after ${new}")
    return Template(tuple(segments))


__all__ = ["NEW", "RangeEnd", "Segment", "Template", "TemplateSyntaxError", "parse"]
