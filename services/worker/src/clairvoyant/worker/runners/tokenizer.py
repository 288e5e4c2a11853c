"""Tokenizers implementing ``runners.base.Tokenizer``, and the chat template both share.

``ByteTokenizer`` serves tiny-random (token id = byte value, specials above 255); ``FastTokenizer``
wraps a ``tokenizers.Tokenizer`` built from a GGUF's vocabulary or a checkpoint's ``tokenizer.json``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from clairvoyant.worker.tools.render import hermes_messages

logger = logging.getLogger(__name__)


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
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        # Some templates (Llama 3.1) print today's date; the clock is injected so tests stay exact.
        env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
        self.source = source
        self._template = env.from_string(source)
        self._special_tokens = special_tokens  # bos_token, eos_token, ... as the template refers to them

    @property
    def knows_tools(self) -> bool:
        """Whether the template renders tools itself (it refers to ``tools``)."""
        return "tools" in self.source

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> str:
        """The chat as the model was trained to read it.  ``tools`` (OpenAI tool dicts) go to the
        template as transformers' ``apply_chat_template(tools=...)`` passes them; a template that
        does not render tools gets them, and the chat's calls and results, written into plain turns
        the way Qwen2.5's template writes them (``tools.hermes_messages``)."""
        has_tool_turns = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
        if not self.knows_tools and (tools or has_tool_turns):
            messages, tools = hermes_messages(messages, tools), None
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools else None,
            **self._special_tokens,
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
        names = (
            {"bos_token": self.special_tokens[0], "eos_token": self.special_tokens[1]}
            if special_tokens
            else {}
        )
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
        try:
            data = bytes(token_ids)  # all plain bytes: the common case, without a Python-level loop
        except ValueError:  # special tokens (ids >= 256) decode to nothing
            data = bytes(t for t in token_ids if 0 <= t < 256)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        return self.encode(self.chat_template.render(messages, add_generation_prompt, tools))


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

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        if self.chat_template is None:
            raise ChatTemplateError("this model carries no chat template")
        return self.encode(self.chat_template.render(messages, add_generation_prompt, tools))


def template_source(tokenizer: object) -> str | None:
    """The Jinja source of a tokenizer's chat template (None: it has none, or is not ours)."""
    if isinstance(tokenizer, ByteTokenizer | FastTokenizer) and tokenizer.chat_template is not None:
        return tokenizer.chat_template.source
    return None


# llama.cpp's pre-tokenizer regexes ("tokenizer.ggml.pre"), expressed as `tokenizers` pre-tokenizers.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(False, use_regex=False),
        ]
    )


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's "smollm"/"starcoder" rule: every digit on its own, then the GPT-2 regex.
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )


PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "llama3": lambda: _split_then_bytes(_LLAMA3_SPLIT),
    "qwen2": lambda: _split_then_bytes(_QWEN2_SPLIT),
}


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table, in which byte-level vocabularies are spelled."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_level_bpe(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], pre: str
) -> tokenizers.Tokenizer:
    """A GPT-2 style byte-level BPE from a GGUF-style vocabulary (``tokenizer.ggml.*``).

    ``token_types`` follow llama.cpp (1 normal, 3 control, 4 user-defined); ``pre`` names the
    pre-tokenizer (``tokenizer.ggml.pre``), GPT-2's when unknown.
    """
    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    # A few files store tokens as raw text; the BPE model wants them in the byte alphabet.
    vocab = {
        (tok if set(tok) <= spelled else "".join(alphabet[b] for b in tok.encode("utf-8"))): i
        for i, tok in enumerate(tokens)
    }
    pairs = [(left, right) for left, _, right in (merge.partition(" ") for merge in merges)]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    if pre not in PRE_TOKENIZERS:
        logger.warning("unknown pre-tokenizer %r; falling back to GPT-2's regex", pre)
    backend.pre_tokenizer = PRE_TOKENIZERS.get(pre, PRE_TOKENIZERS["gpt2"])()
    backend.decoder = decoders.ByteLevel()
    # Control tokens are matched whole and skipped on decode; user-defined ones are only matched whole.
    typed = list(zip(tokens, token_types, strict=True))
    backend.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, kind in typed if kind == 3]
    )
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, kind in typed if kind == 4])
    return backend
