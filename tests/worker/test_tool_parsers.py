"""The streaming tool-call parsers: however the text is split, the pieces reassemble to the
whole-answer parse; content outside calls passes through; what is not a call stays text."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from clairvoyant.core.structured import ToolCall, assemble_calls
from clairvoyant.worker.tools import HERMES, LLAMA3_JSON, CallDelta, ToolCallParser, ToolFormat

pytestmark = pytest.mark.unit


def parse(fmt: ToolFormat, pieces: list[str]) -> tuple[str, list[CallDelta], int]:
    ids = (f"call_{i}" for i in itertools.count())
    parser = ToolCallParser(fmt, new_id=lambda: next(ids))
    text: list[str] = []
    deltas: list[CallDelta] = []
    for piece in [*pieces, None]:
        parsed = parser.feed(piece) if piece is not None else parser.finish()
        text.append(parsed.text)
        deltas.extend(parsed.calls)
    return "".join(text), deltas, parser.calls_made


def whole(fmt: ToolFormat, answer: str) -> tuple[str, tuple[ToolCall, ...]]:
    text, deltas, _ = parse(fmt, [answer])
    return text, assemble_calls(deltas)


def splits(answer: str) -> list[list[str]]:
    """Every split into two pieces, one character at a time, and a few random splits."""
    out = [[answer[:cut], answer[cut:]] for cut in range(len(answer) + 1)]
    out.append(list(answer))
    rng = random.Random(7)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(answer)), min(6, len(answer) - 1)))
        out.append([answer[a:b] for a, b in itertools.pairwise([0, *cuts, len(answer)])])
    return out


def hermes_call(name: str, arguments: str) -> str:
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments + "}\n</tool_call>"


ARGS_A = '{"city": "Paris } {", "days": [1, 2, {"x": "\\"q\\""}], "ok": true}'
ARGS_B = '{"query": "tool_call </tool_call> inside a string"}'

HERMES_CASES = {
    "one call": (hermes_call("weather", ARGS_A), "", [("weather", ARGS_A)]),
    "content before": ("Let me check.\n" + hermes_call("weather", ARGS_A), "Let me check.", [("weather", ARGS_A)]),
    "two calls": (
        hermes_call("weather", ARGS_A) + "\n" + hermes_call("search", ARGS_B),
        "",
        [("weather", ARGS_A), ("search", ARGS_B)],
    ),
    "content after": (hermes_call("search", ARGS_B) + "\nDone. ", "\nDone. ", [("search", ARGS_B)]),
    "layout after": (hermes_call("search", ARGS_B) + "\n \n", "", [("search", ARGS_B)]),
    "content between": (
        "A " + hermes_call("search", ARGS_B) + " B\n" + hermes_call("search", "{}"),
        "A B",
        [("search", ARGS_B), ("search", "{}")],
    ),
    "no call": ("Plain <b>text</b> with a < sign and <tool", "Plain <b>text</b> with a < sign and <tool", []),
    "empty arguments": (hermes_call("ping", "{}"), "", [("ping", "{}")]),
    "unicode": (hermes_call("say", '{"text": "héllo ✓"}'), "", [("say", '{"text": "héllo ✓"}')]),
}


@pytest.mark.parametrize("case", sorted(HERMES_CASES))
def test_hermes_streamed_pieces_reassemble_to_the_whole_answer(case: str) -> None:
    answer, content, calls = HERMES_CASES[case]
    text, assembled = whole(HERMES, answer)
    assert text == content
    assert [(c.name, c.arguments) for c in assembled] == calls
    assert [c.id for c in assembled] == [f"call_{i}" for i in range(len(calls))]
    for pieces in splits(answer):
        streamed_text, deltas, made = parse(HERMES, pieces)
        assert streamed_text == content, pieces
        assert assemble_calls(deltas) == assembled, pieces
        assert made == len(calls)


def test_each_call_opens_with_index_id_and_name_then_only_argument_fragments() -> None:
    answer = hermes_call("weather", ARGS_A) + hermes_call("search", ARGS_B)
    _, deltas, _ = parse(HERMES, list(answer))
    firsts = [d for d in deltas if d.id]
    assert [(d.index, d.id, d.name, d.arguments) for d in firsts] == [
        (0, "call_0", "weather", ""),
        (1, "call_1", "search", ""),
    ]
    rest = [d for d in deltas if not d.id]
    assert all(d.name == "" for d in rest)
    assert "".join(d.arguments for d in rest if d.index == 0) == ARGS_A
    # Fed a character at a time, the arguments stream a character at a time: nothing is held back.
    assert len([d for d in rest if d.index == 0]) == len(ARGS_A)
    # The first piece of call 1 comes after every piece of call 0.
    assert deltas.index(firsts[1]) > max(i for i, d in enumerate(deltas) if d.index == 0)


def test_arguments_are_the_json_text_exactly_as_generated() -> None:
    spaced = '{ "a" :  1 ,"b":[ ] }'
    _, calls = whole(HERMES, hermes_call("f", spaced))
    assert calls[0].arguments == spaced
    assert json.loads(calls[0].arguments) == {"a": 1, "b": []}


@pytest.mark.parametrize(
    "answer",
    [
        "before <tool_call>\nnot json at all\n</tool_call> after",
        'x <tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>',
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1, 2]}\n</tool_call>",
    ],
)
def test_hermes_malformed_calls_pass_through_as_text(answer: str) -> None:
    if '[1, 2]' in answer:
        # Arguments that are no object still stream as that call's (the grammar forbids them).
        text, calls = whole(HERMES, answer)
        assert (text, calls[0].arguments) == ("", "[1, 2]")
        return
    for pieces in splits(answer):
        text, deltas, made = parse(HERMES, pieces)
        assert (text, deltas, made) == (answer, [], 0), pieces


def test_hermes_other_key_order_is_read_whole() -> None:
    answer = 'Hi <tool_call>{"arguments": {"q": "x"}, "name": "search"}</tool_call> there'
    for pieces in splits(answer):
        text, deltas, made = parse(HERMES, pieces)
        assert text == "Hi there"
        assert [(c.name, json.loads(c.arguments)) for c in assemble_calls(deltas)] == [("search", {"q": "x"})]
        assert made == 1


def test_hermes_call_cut_off_keeps_what_streamed() -> None:
    answer = '<tool_call>\n{"name": "f", "arguments": {"a": "unfinish'
    text, deltas, made = parse(HERMES, list(answer))
    assert text == ""
    assert assemble_calls(deltas) == (ToolCall("call_0", "f", '{"a": "unfinish'),)
    assert made == 1
    # Cut off before the name: no call, the text comes back.
    text, deltas, made = parse(HERMES, list('ok <tool_call>\n{"na'))
    assert (text, deltas, made) == ('ok <tool_call>\n{"na', [], 0)


def llama_call(name: str, arguments: str) -> str:
    return '{"name": "' + name + '", "parameters": ' + arguments + "}"


LLAMA_CASES = {
    "one call": (llama_call("weather", ARGS_A), "", [("weather", ARGS_A)]),
    "two calls, vLLM's separator": (
        llama_call("weather", ARGS_A) + "; " + llama_call("search", ARGS_B) + ";",
        "",
        [("weather", ARGS_A), ("search", ARGS_B)],
    ),
    "content around": (
        "Calling now: " + llama_call("search", ARGS_B) + " done",
        "Calling now: done",
        [("search", ARGS_B)],
    ),
    "json that is no call": ('The set {"a": {"name": 1}} stays', 'The set {"a": {"name": 1}} stays', []),
    "name that is no string": ('Odd {"name": 3} here', 'Odd {"name": 3} here', []),
}


@pytest.mark.parametrize("case", sorted(LLAMA_CASES))
def test_llama_streamed_pieces_reassemble_to_the_whole_answer(case: str) -> None:
    answer, content, calls = LLAMA_CASES[case]
    text, assembled = whole(LLAMA3_JSON, answer)
    assert text == content
    assert [(c.name, c.arguments) for c in assembled] == calls
    for pieces in splits(answer):
        streamed_text, deltas, made = parse(LLAMA3_JSON, pieces)
        assert streamed_text == content, pieces
        assert assemble_calls(deltas) == assembled, pieces
        assert made == len(calls)


def test_llama_accepts_arguments_key_too() -> None:
    _, calls = whole(LLAMA3_JSON, '{"name": "f", "arguments": {"x": 1}}')
    assert [(c.name, c.arguments) for c in calls] == [("f", '{"x": 1}')]


def test_a_raw_control_character_in_a_string_is_escaped() -> None:
    answer = hermes_call("f", '{"a": "x\ty\u0001", "b":\t1}').replace("\\t", "\t")
    assert "\t" in answer  # a raw tab inside the string, and one as layout
    for pieces in splits(answer):
        _, deltas, _ = parse(HERMES, pieces)
        (call,) = assemble_calls(deltas)
        assert call.arguments == '{"a": "x\\ty\\u0001", "b":\t1}'
        assert json.loads(call.arguments) == {"a": "x\ty\u0001", "b": 1}
