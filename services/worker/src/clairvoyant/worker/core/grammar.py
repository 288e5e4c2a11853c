"""Grammar-constrained decoding with xgrammar: constraints compiled against the model's vocabulary,
and the token masks applied to a batch's logits.

``GrammarCache.compile`` turns an ``OutputConstraint`` into an ``xgr.CompiledGrammar`` (thread-safe;
callers run it off the engine thread) or raises ``InvalidRequest(param="response_format")``.
``TokenMasks.fill`` fills one bitmask row per constrained sequence from its ``GrammarMatcher``;
``TokenMasks.apply`` masks those rows' logits in place.  docs/structured-outputs.md has the design.

Following vLLM's and SGLang's use of xgrammar, with these choices:

- JSON Schema outputs are compiled with ``any_whitespace=False``: no free whitespace, separators
  ``", "`` and ``": "`` (xgrammar's default for that mode, as ``json.dumps`` writes).  vLLM's
  default lets the model put whitespace anywhere, which small models fill until ``max_tokens``.
- ``json_object`` is the schema ``{"type": "object"}`` compiled the same way.
- A JSON string holds no raw control character and no encoded surrogate (xgrammar 0.2.9's
  grammars let some through; ``with_json_strings`` rewrites those character classes), in
  schemas, ``json_object`` and the JSON of structural tags alike.
- ``choice`` is a regular expression alternating the escaped literal strings.
- Special tokens other than the stop tokens, and the padding ids past the tokenizer's vocabulary
  (the logits may be wider), are never allowed: their vocabulary entries are empty strings, which
  xgrammar treats as special.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch
import xgrammar as xgr

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.worker.runners.base import ModelInfo, Tokenizer
from clairvoyant.worker.runners.tokenizer import ByteTokenizer, FastTokenizer

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept per worker (least recently used dropped first)
PARAM = "response_format"

_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*(Check failed: .*? is false: )?")


def tokenizer_info(tokenizer: Tokenizer, info: ModelInfo) -> xgr.TokenizerInfo:
    """The vocabulary as xgrammar needs it: ``info.vocab_size`` entries (the logits' width), the
    model's EOS ids as stop tokens, special tokens and padding ids blanked (never allowed).

    ``ByteTokenizer``: raw bytes (id = byte value).  ``FastTokenizer``: the vocabulary type and
    prefix-space rule xgrammar detects on the ``tokenizers`` backend (as ``from_huggingface``
    does), with the added special tokens blanked.  Raises ValueError for any other tokenizer."""
    stop_ids = list(info.eos_token_ids)
    if isinstance(tokenizer, ByteTokenizer):
        vocab = [bytes([i]) for i in range(256)] + [b""] * (info.vocab_size - 256)
        return xgr.TokenizerInfo(
            vocab, xgr.VocabType.RAW, vocab_size=info.vocab_size, stop_token_ids=stop_ids
        )
    if isinstance(tokenizer, FastTokenizer):
        from transformers import PreTrainedTokenizerFast  # heavy: only a constrained request pays it

        detected = xgr.TokenizerInfo.from_huggingface(
            PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend),
            vocab_size=info.vocab_size,
            stop_token_ids=stop_ids,
        )
        backend = tokenizer.backend
        specials = {i for i, added in backend.get_added_tokens_decoder().items() if added.special}
        encoded = [""] * info.vocab_size
        for token, i in backend.get_vocab(with_added_tokens=True).items():
            if i < info.vocab_size and i not in specials:
                encoded[i] = token
        return xgr.TokenizerInfo(
            encoded,
            detected.vocab_type,
            vocab_size=info.vocab_size,
            stop_token_ids=stop_ids,
            add_prefix_space=detected.add_prefix_space,
        )
    raise ValueError(f"constrained decoding does not know the tokenizer {type(tokenizer).__name__}")


# xgrammar 0.2.9 spells the characters of a length-bounded JSON string as [^"\\\r\n], which lets
# control characters through unescaped, and both its string classes admit the UTF-8 encodings of
# surrogates (U+D800-U+DFFF): JSON text may hold neither.
_STRING_CHARS = {
    '[^\\"\\\\\\r\\n]': '[^\\"\\\\\\0-\\x1f\\ud800-\\udfff]',
    '[^\\0-\\x1f\\"\\\\\\r\\n]': '[^\\0-\\x1f\\"\\\\\\r\\n\\ud800-\\udfff]',
}


def with_json_strings(compiler: xgr.GrammarCompiler, compiled: xgr.CompiledGrammar) -> xgr.CompiledGrammar:
    """``compiled`` with every JSON string restricted to the characters JSON allows unescaped
    (recompiled from its EBNF text); ``compiled`` itself when it has no JSON string or its text
    does not parse back."""
    text = str(compiled.grammar)
    fixed = text
    for lenient, strict in _STRING_CHARS.items():
        fixed = fixed.replace(lenient, strict)
    if fixed == text:
        return compiled
    try:
        grammar = xgr.Grammar.from_ebnf(fixed)
    except RuntimeError:
        return compiled
    return compiler.compile_grammar(grammar)


def choice_regex(choices: Sequence[str]) -> str:
    """A regular expression matching exactly one of ``choices``."""
    return "(" + "|".join(re.escape(choice) for choice in choices) + ")"


class Compiled(NamedTuple):
    grammar: xgr.CompiledGrammar
    cache_hit: bool


class GrammarCache:
    """Compiles constraints for one model; a bounded LRU of the results, keyed by the constraint.

    Thread-safe: the worker compiles on a thread pool while the engine thread decodes.  The
    vocabulary (``tokenizer_info``) is built on the first compile.  ``compile`` raises
    ``InvalidRequest(param="response_format")`` for a constraint xgrammar cannot compile."""

    def __init__(self, tokenizer: Tokenizer, info: ModelInfo, capacity: int = DEFAULT_CACHE_SIZE) -> None:
        if capacity < 1:
            raise ValueError("the grammar cache needs a capacity >= 1")
        self._tokenizer = tokenizer
        self._info = info
        self.capacity = capacity
        self._compiler: xgr.GrammarCompiler | None = None
        self._compiled: OrderedDict[OutputConstraint, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0  # constraints compiled (each miss that succeeded)
        self.hits = 0

    def compiler(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                # xgrammar's own cache is off: ours is bounded by count and keyed by the constraint.
                vocab = tokenizer_info(self._tokenizer, self._info)
                self._compiler = xgr.GrammarCompiler(vocab, max_threads=2, cache_enabled=False)
            return self._compiler

    def compile(self, constraint: OutputConstraint) -> Compiled:
        with self._lock:
            grammar = self._compiled.get(constraint)
            if grammar is not None:
                self._compiled.move_to_end(constraint)
                self.hits += 1
                return Compiled(grammar, True)
        grammar = _compile(self.compiler(), constraint)  # outside the lock: compiles run in parallel
        with self._lock:
            self._compiled[constraint] = grammar
            self._compiled.move_to_end(constraint)
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
            self.compiles += 1
        return Compiled(grammar, False)

    def __len__(self) -> int:
        return len(self._compiled)


def _compile(compiler: xgr.GrammarCompiler, constraint: OutputConstraint) -> xgr.CompiledGrammar:
    kind, spec = constraint.kind, constraint.spec
    try:
        if kind == "json_schema":
            return with_json_strings(compiler, compiler.compile_json_schema(spec, any_whitespace=False))
        if kind == "json_object":
            return with_json_strings(
                compiler, compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            )
        if kind == "regex":
            return compiler.compile_regex(spec)
        if kind == "ebnf":
            return compiler.compile_grammar(spec)
        if kind == "choice":
            choices = json.loads(spec)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise InvalidRequest("a choice constraint needs a non-empty list of strings", param=PARAM)
            return compiler.compile_regex(choice_regex(choices))
        if kind == "structural_tag":
            return with_json_strings(compiler, compiler.compile_structural_tag(spec))
    except InvalidRequest:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar reports bad input as RuntimeError
        message = _CPP_PREFIX.sub("", str(exc).strip()).splitlines()[0] if str(exc).strip() else repr(exc)
        raise InvalidRequest(f"invalid {kind} constraint: {message}", param=PARAM) from exc
    raise InvalidRequest(f"unknown constraint kind {kind!r}", param=PARAM)


class TokenMasks:
    """The token bitmask of one engine: one buffer per batch size, allocated once and reused."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._buffers: dict[int, torch.Tensor] = {}
        self._batch = xgr.BatchGrammarMatcher(max_threads=1)

    def fill(
        self, batch_size: int, rows: Sequence[int], matchers: Sequence[xgr.GrammarMatcher]
    ) -> torch.Tensor:
        """Fill the bitmask rows ``rows`` (of a ``batch_size``-row buffer) from ``matchers``."""
        bitmask = self._buffers.get(batch_size)
        if bitmask is None:
            bitmask = self._buffers[batch_size] = xgr.allocate_token_bitmask(batch_size, self.vocab_size)
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, rows[0])
        else:
            self._batch.batch_fill_next_token_bitmask(list(matchers), bitmask, list(rows))
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """Set the disallowed tokens' logits of ``rows`` to -inf, in place (on the logits' device)."""
        xgr.apply_token_bitmask_inplace(
            logits,
            bitmask.to(logits.device, non_blocking=True),
            vocab_size=self.vocab_size,
            indices=list(rows),
        )


def allows_only(bitmask_row: torch.Tensor, token_ids: Sequence[int]) -> bool:
    """Whether the bitmask row allows no token outside ``token_ids`` (e.g. only EOS)."""
    rest = bitmask_row.to(torch.int64) & 0xFFFFFFFF  # the int32 words as unsigned bits
    for token in token_ids:
        rest[token // 32] &= ~(1 << (token % 32))
    return not bool(rest.any())
