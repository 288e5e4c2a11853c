"""Untrusted JSON in, bounded: the body's bytes decoded, and every string in it checked.

``decode_json`` refuses what ``json.loads`` cannot take safely: bytes that are not UTF-8, and
nesting deep enough to exhaust Python's recursion limit inside the decoder.  ``check_strings``
refuses strings that cannot travel on (over-long ones, and lone UTF-16 surrogates, which a JSON
``"\\ud800"`` escape produces and UTF-8, so protobuf, cannot encode).  Both raise InvalidRequest.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

from clairvoyant.core.errors import InvalidRequest

# A JSON string literal, escapes included (the unrolled form: linear, no catastrophic backtracking).
_LITERAL = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_STRING = re.compile(_LITERAL.encode(), re.DOTALL)
_TEXT_STRING = re.compile(_LITERAL, re.DOTALL)
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(_STEP)))
_SURROGATE = re.compile("[\ud800-\udfff]")

Loc = tuple[str | int, ...]  # ("messages", 0, "content")
_Link = tuple["_Link", str | int] | None  # a Loc as linked (parent, key) pairs: cheap to extend
_NESTED = (str, dict, list)


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text, counted without parsing it (so
    without recursion): brackets inside string literals are dropped, the rest summed as +1/-1."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def decode_json(data: bytes, max_depth: int) -> object:
    """The decoded JSON text.  400 ``invalid_encoding`` for bytes that are not UTF-8 (RFC 8259 allows
    nothing else), ``nesting_too_deep`` past ``max_depth`` levels, ``invalid_json`` otherwise."""
    try:
        text = data.decode("utf-8")  # strict: encoded surrogates (ED A0 80) are refused too
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}", code="invalid_encoding"
        ) from None
    depth = nesting_depth(data)
    if depth > max_depth:
        raise InvalidRequest(
            f"the body nests arrays and objects {depth} levels deep; at most {max_depth} are allowed",
            code="nesting_too_deep",
        )
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from None


def format_param(loc: Loc) -> str:
    """("messages", 0, "role") -> "messages[0].role", as OpenAI names parameters."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def check_strings(document: object, max_chars: int) -> None:
    """Raise InvalidRequest naming the first string (object keys included, in document order) that
    is longer than ``max_chars`` characters or holds a lone surrogate.  ``document`` is decoded JSON
    no deeper than ``decode_json`` allows."""
    # First in C, over the document as text: a string literal is never shorter than its string.
    text = json.dumps(document, ensure_ascii=False)
    longest = max(map(len, _TEXT_STRING.findall(text)), default=2) - 2
    if longest <= max_chars and not _SURROGATE.search(text):
        return
    # Then walk to name the offender.
    pending: list[tuple[_Link, object]] = [(None, document)]
    while pending:
        link, value = pending.pop()
        if isinstance(value, str):
            _check_string(value, link, max_chars)
        elif isinstance(value, dict):
            for key in value:
                _check_string(key, link, max_chars, "a key in ")
            pending.extend([((link, k), v) for k, v in reversed(value.items()) if isinstance(v, _NESTED)])
        elif isinstance(value, list):
            pending.extend(
                [((link, i), v) for i, v in reversed(list(enumerate(value))) if isinstance(v, _NESTED)]
            )


def _param(link: _Link) -> str | None:
    loc: list[str | int] = []
    while link is not None:
        link, key = link
        loc.append(key)
    return format_param(tuple(reversed(loc))) if loc else None


def _check_string(value: str, link: _Link, max_chars: int, what: str = "") -> None:
    if len(value) <= max_chars and (value.isascii() or not _SURROGATE.search(value)):
        return
    param = _param(link)
    where = what + (param or "the body")
    if len(value) > max_chars:
        raise InvalidRequest(
            f"{where} is {len(value)} characters long; at most {max_chars} are allowed",
            param=param,
            code="string_above_max_length",
        )
    raise InvalidRequest(
        f"{where} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not "
        "valid Unicode",
        param=param,
        code="invalid_encoding",
    )
