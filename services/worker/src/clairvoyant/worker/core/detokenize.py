"""Incremental detokenization with stop strings.

Text is released only when it is final:

    decoded output text:  "... the answer is 4<S"      stop = ("<STOP>",)
                           |------ emitted ------|hold|
    * a trailing U+FFFD (an incomplete multi-byte character) is never decoded into ``text``;
    * the longest tail that is a prefix of some stop string ("<S") is held back until disambiguated;
    * once a stop string matches, ``text`` is cut at its start and nothing after it is ever released.

Decoding re-reads a short window of tokens (``prefix_offset .. end``) instead of the whole output, so
each step costs O(window), and tokenizers whose pieces depend on their left neighbour (SentencePiece's
leading space) decode correctly because the window starts a few prompt tokens back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from clairvoyant.worker.runners.base import Tokenizer

_PROMPT_CONTEXT_TOKENS = 6  # prompt tokens kept as left context for the first output tokens
_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Per-request text state.  ``append`` each new token, then ``take`` the releasable text."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._token_ids = list(prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:])
        # Window [prefix_offset, read_offset) is already decoded into text; it is the left context.
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._stop = tuple(stop)
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self.text = ""  # decoded output text so far (cut at the stop string once one matched)
        self._emitted = 0  # len of text already released
        self._scanned = 0  # len of text already searched for stop strings
        self.stopped = False  # a stop string matched
        self.matched_stop: str | None = None  # which one (the earliest in the text)
        self.wants_tokens = True

    def append(self, token_id: int) -> None:
        """Add one generated token (not after ``stopped``)."""
        assert not self.stopped
        self._token_ids.append(token_id)
        prefix_text = self._tokenizer.decode(self._token_ids[self._prefix_offset : self._read_offset])
        full_text = self._tokenizer.decode(self._token_ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT_CHAR):
            self.text += full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._token_ids)

    def extend(self, token_ids: Sequence[int]) -> None:
        """Add many generated tokens at once, decoding the window once instead of per token.

        The text after the last token equals what ``append`` per token gives, except that a
        character still incomplete at the end holds back the text decoded in the same call.
        """
        assert not self.stopped
        if not token_ids:
            return
        self._token_ids.extend(token_ids)
        prefix_text = self._tokenizer.decode(self._token_ids[self._prefix_offset : self._read_offset])
        full_text = self._tokenizer.decode(self._token_ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT_CHAR):
            self.text += full_text[len(prefix_text) :]
            # Keep a short left context, as ``append`` does: the window restarts near the end.
            self._prefix_offset = max(self._read_offset, len(self._token_ids) - _PROMPT_CONTEXT_TOKENS)
            self._read_offset = len(self._token_ids)

    def take(self, check_stop: bool) -> str:
        """Release what is final; with ``check_stop``, match stop strings in the text not yet scanned."""
        if check_stop and self._stop:
            start = max(0, self._scanned - self._max_stop_len + 1)
            hits = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self._stop) if i >= 0]
            if hits:
                index, self.matched_stop = min(hits, key=lambda hit: hit[0])
                self.text = self.text[:index]
                self.stopped = True
        self._scanned = len(self.text)
        end = len(self.text) if self.stopped else len(self.text) - self._stop_prefix_len()
        released = self.text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return released

    def flush(self) -> str:
        """At the end of the request: release everything still held, incomplete characters included."""
        if not self.stopped:
            prefix_text = self._tokenizer.decode(self._token_ids[self._prefix_offset : self._read_offset])
            full_text = self._tokenizer.decode(self._token_ids[self._prefix_offset :])
            self.text += full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset = len(self._token_ids)
        released = self.text[self._emitted :]
        self._emitted = len(self.text)
        return released

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        for length in range(min(self._max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-length:]
            if any(s.startswith(tail) for s in self._stop):
                return length
        return 0


class Detokenizer(Protocol):
    """What the engine needs of a request's detokenizer (``IncrementalDetokenizer`` or ``NoText``)."""

    stopped: bool
    matched_stop: str | None
    wants_tokens: bool  # False: every call releases no text, so callers may skip them
    text: str

    def append(self, token_id: int) -> None: ...

    def extend(self, token_ids: Sequence[int]) -> None: ...

    def take(self, check_stop: bool) -> str: ...

    def flush(self) -> str: ...


class NoText:
    """The detokenizer of a request that wants token ids only: every call releases no text."""

    stopped = False
    matched_stop: str | None = None
    wants_tokens = False
    text = ""

    def append(self, token_id: int) -> None:
        pass

    def extend(self, token_ids: Sequence[int]) -> None:
        pass

    def take(self, check_stop: bool) -> str:
        return ""

    def flush(self) -> str:
        return ""
