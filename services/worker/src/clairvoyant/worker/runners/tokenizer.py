"""Tokenizers implementing ``runners.base.Tokenizer``, and the chat template both share.

``ByteTokenizer`` serves tiny-random (token id = byte value, specials above 255); ``FastTokenizer``
wraps a ``tokenizers.Tokenizer`` built from a GGUF's vocabulary or a checkpoint's ``tokenizer.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The model's template rejected the chat (it called ``raise_exception``)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # Templates expect transformers' flavour: unicode kept as is, key order preserved.
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A model's Jinja chat template, rendered the way transformers renders it.

    Same environment options (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, sandboxed) and the
    same helpers (``raise_exception``, ``strftime_now``, ``tojson``), so the ids match the reference.
    """

    def __init__(
        self, source: str, special_tokens: dict[str, str], now: Callable[[], datetime] = datetime.now
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        # Some templates (Llama 3.1) print today's date; the clock is injected so tests stay exact.
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._special_tokens = special_tokens  # bos_token, eos_token, ... as the template refers to them

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=list(messages), add_generation_prompt=add_generation_prompt, **self._special_tokens
        )


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ByteTokenizer:
    """Token id = UTF-8 byte value (0-255); special tokens take the ids after 255, in order.

    Special-token strings found in text (as a rendered chat template produces) encode to their ids,
    as in transformers; decoding skips them and replaces invalid UTF-8.
    """

    def __init__(self, special_tokens: Sequence[str], chat_template: str = CHATML_TEMPLATE) -> None:
        self.special_tokens = list(special_tokens)
        self.special_ids = {token: 256 + i for i, token in enumerate(self.special_tokens)}
        self.vocab_size = 256 + len(self.special_tokens)
        self._special_pattern = re.compile("(" + "|".join(re.escape(t) for t in self.special_tokens) + ")")
        names = {"bos_token": self.special_tokens[0], "eos_token": self.special_tokens[1]} if special_tokens else {}
        self.chat_template = ChatTemplate(chat_template, names)

    def encode(self, text: str) -> list[int]:
        if not self.special_tokens:
            return list(text.encode("utf-8"))
        ids: list[int] = []
        for i, piece in enumerate(self._special_pattern.split(text)):
            # re.split with one capture group alternates plain text (even) and matched specials (odd).
            ids.extend([self.special_ids[piece]] if i % 2 else piece.encode("utf-8"))
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.chat_template.render(messages, add_generation_prompt))


class FastTokenizer:
    """A ``tokenizers.Tokenizer`` (BPE from GGUF metadata, or a checkpoint's tokenizer.json) plus its template."""

    def __init__(self, backend: tokenizers.Tokenizer, chat_template: ChatTemplate | None) -> None:
        self.backend = backend
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self.backend.decode(list(token_ids), skip_special_tokens=True))

    def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        if self.chat_template is None:
            raise ChatTemplateError("this model carries no chat template")
        return self.encode(self.chat_template.render(messages, add_generation_prompt))
