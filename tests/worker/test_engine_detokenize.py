"""Incremental detokenization: UTF-8 safety and stop-string hold-back, driven token by token."""

from __future__ import annotations

import pytest

from clairvoyant.worker.core.detokenize import IncrementalDetokenizer
from tests.worker.fakes import ByteTokenizer

pytestmark = pytest.mark.unit

TOKENIZER = ByteTokenizer()


def _feed(
    text: str, stop: tuple[str, ...] = (), check_stop: bool = True
) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(TOKENIZER, TOKENIZER.encode("prompt: é"), stop)
    pieces = []
    for token in TOKENIZER.encode(text):
        detok.append(token)
        pieces.append(detok.take(check_stop))
        if detok.stopped:
            break
    return pieces, detok


def test_multibyte_characters_are_never_split() -> None:
    text = "añb€c😀d"
    pieces, detok = _feed(text)
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    # "€" is 3 bytes: nothing for the first two, the whole character on the third.
    euro = len("añb".encode())
    assert pieces[euro : euro + 3] == ["", "", "€"]


def test_incomplete_character_is_flushed_at_the_end() -> None:
    detok = IncrementalDetokenizer(TOKENIZER, [104, 105], ())
    for token in b"ok" + "€".encode()[:2]:
        detok.append(token)
    assert detok.take(check_stop=True) == "ok"
    assert detok.flush() == "\ufffd"


def test_stop_string_is_excluded_and_its_prefix_held() -> None:
    pieces, detok = _feed("hello <END> world", stop=("<END>",))
    assert detok.stopped
    assert "".join(pieces) == "hello "
    assert pieces[6] == ""  # "<" might start "<END>"
    assert detok.flush() == ""


def test_held_prefix_is_released_when_it_does_not_continue() -> None:
    pieces, detok = _feed("a<EN!b", stop=("<END>",))
    assert pieces == ["a", "", "", "", "<EN!", "b"]
    assert not detok.stopped and detok.flush() == ""


def test_earliest_of_several_stops_wins_and_unchecked_text_is_not_matched() -> None:
    pieces, detok = _feed("xx STOP yy END", stop=("END", "STOP"))
    assert "".join(pieces) == "xx "
    pieces, detok = _feed("STOP", stop=("STOP",), check_stop=False)
    assert not detok.stopped and "".join(pieces) + detok.flush() == "STOP"
