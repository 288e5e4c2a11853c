"""Path expression AST, printer and parser: round-trip, canonical text, error messages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from clairvoyant.profiler.core.expr import (
    Agent,
    Alt,
    End,
    ExpressionError,
    FanOut,
    Opt,
    ParseError,
    Repeat,
    Seq,
    agents_of,
    alt,
    parse,
    seq,
    to_text,
)
from tests.profiler.strategies import expressions

pytestmark = pytest.mark.unit

LISTING_1 = "planner -> <explorer>{3,4} -> (engineer){3,6} -> reviewer -> ((engineer){2,4} -> reviewer)? -> verifier -> $"


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_print_then_parse_is_identity(expr: object) -> None:
    text = to_text(expr)  # type: ignore[arg-type]
    assert parse(text) == expr
    assert to_text(parse(text)) == text


def test_listing_1_parses_to_the_expected_tree() -> None:
    expr = parse(LISTING_1)
    engineer, reviewer = Agent("engineer"), Agent("reviewer")
    assert expr == Seq(
        (
            Agent("planner"),
            FanOut(Agent("explorer"), 3, 4),
            Repeat(engineer, 3, 6),
            reviewer,
            Opt(Seq((Repeat(engineer, 2, 4), reviewer))),
            Agent("verifier"),
            End(),
        )
    )
    assert to_text(expr) == LISTING_1
    assert agents_of(expr) == {"planner", "explorer", "engineer", "reviewer", "verifier"}


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("a->b", "a -> b"),
        ("  (a|b)  ", "(a | b)"),
        ("(a){2}", "(a){2}"),
        ("(a){2,2}", "(a){2}"),
        ("((a | b)){1,3}", "(a | b){1,3}"),
        ("(a)", "a"),
        ("<a|b>{1,2}", "<a | b>{1,2}"),
        ("(a -> b) -> c", "(a -> b) -> c"),
        ("(a | (b | c))", "(a | (b | c))"),
        ("x-1 -> y-", "x-1 -> y-"),
        ("<y- >{2}", "<y- >{2}"),
        ("(a -> $ | b) -> c", "(a -> $ | b) -> c"),
    ],
)
def test_canonical_text(text: str, canonical: str) -> None:
    assert to_text(parse(text)) == canonical


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("a ->", 4, "an agent id"),
        ("(a | b", 6, '")"'),
        ("a b", 2, '"->" or end of input'),
        ("a | b", 2, "alternatives need parentheses"),
        ("<a>", 3, "fan-out bounds"),
        ("(a){x}", 4, "non-negative integer"),
        ("(a){3,1}", 3, "0 <= m <= n"),
        ("<a>{0,2}", 3, "1 <= m <= n"),
        ("<a -> b>{2}", 1, "inside <...>"),
        ("a)", 1, "unbalanced"),
        ("(a){2", 5, '"," or "}"'),
        ("", 0, "an agent id"),
        ("a -> ?", 5, "an agent id"),
    ],
)
def test_parse_errors_say_where_and_what(text: str, position: int, expected: str) -> None:
    with pytest.raises(ParseError) as info:
        parse(text)
    assert info.value.position == position
    assert expected in str(info.value)
    assert expected in info.value.expected or expected in str(info.value)


def test_invalid_trees_are_rejected() -> None:
    with pytest.raises(ExpressionError):
        Agent("has space")
    with pytest.raises(ExpressionError):
        Repeat(Agent("a"), 2, 1)
    with pytest.raises(ExpressionError):
        Seq((Agent("a"),))
    with pytest.raises(ExpressionError):
        FanOut(Seq((Agent("a"), Agent("b"))), 1, 2)  # type: ignore[arg-type]


def test_flattening_constructors() -> None:
    a, b, c = Agent("a"), Agent("b"), Agent("c")
    assert seq(a, None, Seq((b, c))) == Seq((a, b, c))
    assert seq(None) is None
    assert seq(a) == a
    assert alt(a, Alt((b, a)), c) == Alt((a, b, c))
    assert alt(a, a) == a
