"""json_input: decoding bounded JSON and naming the first bad string; the settings that bound it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.json_input import check_strings, decode_json, nesting_depth
from clairvoyant.core.openai_schema import DEFAULT_LIMITS, InputLimits
from clairvoyant.gateway.config import GatewaySettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [{"b": []}], "c": {}}', 4),
        (b'"[[[["', 0),  # brackets inside a string do not count
        (b'["\\"[[[", "\\\\", []]', 2),  # nor after an escaped quote; an escaped backslash ends nothing
        (b"[" * 5000 + b"]" * 5000, 5000),
    ],
)
def test_nesting_depth(text: bytes, depth: int) -> None:
    assert nesting_depth(text) == depth


def refusal(call: object) -> tuple[str, str | None]:
    assert callable(call)
    with pytest.raises(InvalidRequest) as caught:
        call()
    assert caught.value.http_status == 400
    return caught.value.code, caught.value.param


def test_decode_json_refusals() -> None:
    assert decode_json(b'{"a": ["\\ud83d\\ude00"]}', 2) == {"a": ["\U0001f600"]}
    assert refusal(lambda: decode_json(b"[[[]]]", 2)) == ("nesting_too_deep", None)
    assert refusal(lambda: decode_json(b'{"a": "\xff"}', 8)) == ("invalid_encoding", None)
    assert refusal(lambda: decode_json(b'{"a": "\xed\xa0\x80"}', 8)) == ("invalid_encoding", None)
    assert refusal(lambda: decode_json(b'{"a": ', 8)) == ("invalid_json", None)
    assert refusal(lambda: decode_json(b"\xef\xbb\xbf{}", 8)) == ("invalid_json", None)  # a BOM


def test_check_strings_names_the_first_offender_in_document_order() -> None:
    document = json.loads('{"ok": "\\ud83d\\ude00", "b": [1, {"c": "\\udc00"}], "d": "\\ud800"}')
    assert refusal(lambda: check_strings(document, 100)) == ("invalid_encoding", "b[1].c")
    assert refusal(lambda: check_strings({"x": {"\udfff": 1}}, 100)) == ("invalid_encoding", "x")
    assert refusal(lambda: check_strings(["ok", "x" * 11], 10)) == ("string_above_max_length", "[1]")
    assert refusal(lambda: check_strings({"k" * 11: 1}, 10)) == ("string_above_max_length", None)
    check_strings({"k" * 10: ["x" * 10, 1.5, None, True, "\U0001f600"]}, 10)


def test_input_limit_settings() -> None:
    assert GatewaySettings().input_limits() == DEFAULT_LIMITS == InputLimits(524_288, 2048, 4)
    assert GatewaySettings().max_json_depth == 64
    custom = GatewaySettings(max_string_chars=10, max_messages=3, max_stop_sequences=1)
    assert custom.input_limits() == InputLimits(max_string_chars=10, max_messages=3, max_stop_sequences=1)
    for bad in (
        {"max_json_depth": 3},
        {"max_json_depth": 257},
        {"max_stop_sequences": 0},
        {"max_messages": 0},
    ):
        with pytest.raises(ValidationError):
            GatewaySettings(**bad)
