"""Bounded path expressions: the AST, a printer and a parser.

Pythia (seed 000, §4.1, Listing 1) describes a workflow as a regular expression over agent roles
whose loops are *bounded* to their dominant percentile.  The grammar (whitespace is insignificant):

    expr   := seq
    seq    := term ( "->" term )*
    term   := AGENT
            | "$"                                    terminal: the workflow ends here
            | "(" alt ")"                            grouping; with "|" inside: alternatives
            | "(" alt ")" "?"                        optional
            | "(" alt ")" "{" INT [ "," INT ] "}"    bounded repetition {m,n} ({m} = {m,m})
            | "<" alt ">" "{" INT [ "," INT ] "}"    parallel fan-out of m..n calls in one step
    alt    := seq ( "|" seq )*
    AGENT  := [A-Za-z0-9._:@/+=-]+                   (an agent id; "->" always ends a name)

The language is made of steps (``trace.Step``).  ``parse`` raises ``ParseError`` (with the position)
on text outside the grammar; building a node with invalid parts raises ``ExpressionError``.  The AST
is kept as written, so ``parse(to_text(e)) == e`` for every valid tree; ``seq``/``alt`` are the
flattening constructors.  The choices where the paper is silent: docs/profiler.md, "Path expressions".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

AGENT_PATTERN = re.compile(r"[A-Za-z0-9._:@/+=-]+")
_AGENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/+=-")


class ExpressionError(ValueError):
    """A tree that breaks the grammar's rules (bad bounds, bad agent id, misplaced node)."""


class ParseError(ExpressionError):
    """Text that does not parse: ``position`` is a 0-based character offset into ``text``."""

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        self.found = found
        pointer = " " * position + "^"
        super().__init__(f"at position {position}: expected {expected}, found {found}\n  {text}\n  {pointer}")


@dataclass(frozen=True, slots=True)
class Agent:
    name: str

    def __post_init__(self) -> None:
        if not AGENT_PATTERN.fullmatch(self.name):
            raise ExpressionError(f"invalid agent id {self.name!r}")


@dataclass(frozen=True, slots=True)
class End:
    """``$``: the workflow ends here."""


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if len(self.items) < 2:
            raise ExpressionError("a sequence needs at least two items")


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if len(self.options) < 2:
            raise ExpressionError("an alternative needs at least two options")


@dataclass(frozen=True, slots=True)
class Opt:
    body: Expr


@dataclass(frozen=True, slots=True)
class Repeat:
    body: Expr
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (0 <= self.lo <= self.hi) or self.hi < 1:
            raise ExpressionError(
                f"repetition bounds must satisfy 0 <= m <= n, n >= 1; got {{{self.lo},{self.hi}}}"
            )


@dataclass(frozen=True, slots=True)
class FanOut:
    """One step of ``lo..hi`` parallel calls, each an agent of ``body`` (an Agent or an Alt of Agents)."""

    body: Agent | Alt
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (1 <= self.lo <= self.hi):
            raise ExpressionError(f"fan-out bounds must satisfy 1 <= m <= n; got {{{self.lo},{self.hi}}}")
        if isinstance(self.body, Alt):
            if not all(isinstance(o, Agent) for o in self.body.options):
                raise ExpressionError("a fan-out body is an agent or an alternative of agents")
        elif not isinstance(self.body, Agent):
            raise ExpressionError("a fan-out body is an agent or an alternative of agents")

    @property
    def members(self) -> tuple[str, ...]:
        if isinstance(self.body, Agent):
            return (self.body.name,)
        return tuple(o.name for o in self.body.options)  # type: ignore[union-attr]


Expr = Union[Agent, End, Seq, Alt, Opt, Repeat, FanOut]  # noqa: UP007 - a runtime alias


def seq(*items: Expr | None) -> Expr | None:
    """A flattened sequence (None items are empty; a single item is returned as is)."""
    flat: list[Expr] = []
    for item in items:
        if item is None:
            continue
        flat.extend(item.items if isinstance(item, Seq) else (item,))
    if not flat:
        return None
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*options: Expr) -> Expr:
    """A flattened alternative without duplicate options (first occurrence kept)."""
    flat: list[Expr] = []
    for option in options:
        for o in option.options if isinstance(option, Alt) else (option,):
            if o not in flat:
                flat.append(o)
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def agents_of(expr: Expr) -> frozenset[str]:
    """Every agent id the expression mentions."""
    if isinstance(expr, Agent):
        return frozenset((expr.name,))
    if isinstance(expr, End):
        return frozenset()
    if isinstance(expr, FanOut):
        return frozenset(expr.members)
    if isinstance(expr, Seq):
        return frozenset().union(*(agents_of(i) for i in expr.items))
    if isinstance(expr, Alt):
        return frozenset().union(*(agents_of(o) for o in expr.options))
    return agents_of(expr.body)


# ---------------------------------------------------------------------------------------- printer


def _bounds(lo: int, hi: int) -> str:
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def to_text(expr: Expr) -> str:
    """The canonical text of ``expr``; ``parse(to_text(e)) == e``."""
    if isinstance(expr, Agent):
        return expr.name
    if isinstance(expr, End):
        return "$"
    if isinstance(expr, Seq):
        return " -> ".join(f"({to_text(i)})" if isinstance(i, Seq) else to_text(i) for i in expr.items)
    if isinstance(expr, Alt):
        return "(" + _inner(expr) + ")"
    if isinstance(expr, Opt):
        return f"({_inner(expr.body)})?"
    if isinstance(expr, Repeat):
        return f"({_inner(expr.body)}){_bounds(expr.lo, expr.hi)}"
    if isinstance(expr, FanOut):
        body = _inner(expr.body)
        return f"<{body}{' ' if body.endswith('-') else ''}>{_bounds(expr.lo, expr.hi)}"  # "a- >", not "a->"
    raise ExpressionError(f"not an expression node: {expr!r}")


def _inner(body: Expr) -> str:
    """The text inside ``( )?``, ``( ){m,n}`` or ``< >``: an Alt loses its own parentheses."""
    if isinstance(body, Alt):
        return " | ".join(to_text(o) for o in body.options)  # a nested Alt keeps its own parentheses
    return to_text(body)


# ----------------------------------------------------------------------------------------- parser


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, expected: str) -> ParseError:
        self.skip()
        found = "end of input" if self.pos >= len(self.text) else repr(self.text[self.pos])
        return ParseError(self.text, self.pos, expected, found)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str, what: str) -> None:
        if not self.take(token):
            raise self.fail(what)

    def parse(self) -> Expr:
        expr = self.seq()
        self.skip()
        if self.pos < len(self.text):
            if self.text[self.pos] == "|":
                raise self.fail('"->" or end of input (alternatives need parentheses: "(a | b)")')
            raise self.fail(
                '"->" or end of input' if self.text[self.pos] != ")" else "end of input (unbalanced ')')"
            )
        return expr

    def seq(self) -> Expr:
        items = [self.term()]
        while self.take("->"):
            items.append(self.term())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def alt(self) -> Expr:
        options = [self.seq()]
        while self.take("|"):
            options.append(self.seq())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def integer(self) -> int:
        self.skip()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos].isdigit():
            self.pos += 1
        if start == self.pos:
            raise self.fail("a non-negative integer")
        return int(self.text[start : self.pos])

    def bounds(self) -> tuple[int, int, int]:
        start = self.pos
        self.expect("{", '"{m,n}"')
        lo = self.integer()
        hi = self.integer() if self.take(",") else lo
        self.expect("}", '"}"' if hi != lo or self.peek(",") else '"," or "}"')
        return lo, hi, start

    def term(self) -> Expr:
        self.skip()
        start = self.pos
        if self.take("$"):
            return End()
        if self.take("("):
            inner = self.alt()
            self.expect(")", '"|", "->" or ")"')
            if self.take("?"):
                return Opt(inner)
            if self.peek("{"):
                lo, hi, at = self.bounds()
                try:
                    return Repeat(inner, lo, hi)
                except ExpressionError as exc:
                    raise ParseError(
                        self.text, at, "bounds with 0 <= m <= n and n >= 1", f"{{{lo},{hi}}}"
                    ) from exc
            return inner
        if self.take("<"):
            inner = self.alt()
            self.expect(">", '"|" or ">"')
            if not self.peek("{"):
                raise self.fail('fan-out bounds "{m,n}" after ">"')
            lo, hi, at = self.bounds()
            if not isinstance(inner, (Agent, Alt)) or (
                isinstance(inner, Alt) and not all(isinstance(o, Agent) for o in inner.options)
            ):
                raise ParseError(
                    self.text,
                    start + 1,
                    "an agent or agents separated by '|' inside <...>",
                    "a compound expression",
                )
            try:
                return FanOut(inner, lo, hi)
            except ExpressionError as exc:
                raise ParseError(self.text, at, "fan-out bounds with 1 <= m <= n", f"{{{lo},{hi}}}") from exc
        name_end = self.pos
        while name_end < len(self.text) and self.text[name_end] in _AGENT_CHARS:
            if self.text.startswith("->", name_end):
                break
            name_end += 1
        if name_end == self.pos:
            raise self.fail('an agent id, "$", "(" or "<"')
        name = self.text[self.pos : name_end]
        self.pos = name_end
        return Agent(name)


def parse(text: str) -> Expr:
    """Parse a bounded path expression.  Raises ParseError (position + what was expected)."""
    return _Parser(text).parse()
