"""Prompt text for live runs: the simulator's ``PromptBook`` ids, spelled as printable characters.

The gateway's ``/v1/completions`` takes a string (not token ids), so a live prompt is text.  Each
id maps to one printable ASCII character, and an emulated worker's byte tokenizer turns each
character back into exactly one token: prompt lengths are exact, and prefix sharing (system
prompts, earlier prompts and replies copied into later ones) is the same as in the simulator.
``<`` is left out so no run of characters ever spells a special token (``<bos>``, ``<|im_start|>``).

With a real tokenizer (the torch runner) the text is still built to the workload's lengths in
characters, and the worker's count differs; the records then carry the worker's own counts.
"""

from __future__ import annotations

from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.workloads.program import Call

_FIRST, _LAST, _FORBIDDEN = 33, 126, ord("<")  # '!' .. '~' without '<'
ALPHABET = "".join(chr(c) for c in range(_FIRST, _LAST + 1) if c != _FORBIDDEN)


def spell(token_id: int) -> str:
    """One printable character per id; a printable id spells itself, so a reply's characters
    copied into a later prompt come back as the very tokens the worker generated."""
    if _FIRST <= token_id <= _LAST and token_id != _FORBIDDEN:
        return chr(token_id)
    return ALPHABET[token_id % len(ALPHABET)]


class TextPrompts:
    """The text of each call's prompt; remembers replies for later segments to copy."""

    def __init__(self, seed: int) -> None:
        self._book = PromptBook(seed)

    def prompt(self, workflow_type: str, call: Call) -> str:
        return "".join(spell(i) for i in self._book.prompt(workflow_type, call))

    def record_response(self, call_id: str, text: str) -> None:
        self._book.record_response(call_id, [ord(c) for c in text])

    def forget(self, call_ids: list[str]) -> None:
        self._book.forget(call_ids)
