"""Speculation accounting: tokens the cache manager staged on a prediction, and whether they were used.

A directive with ``speculative=True`` (promote, pre-prefill) names a prompt: its ``token_ids`` (or,
for a promotion by hash alone, ``16 * len(block_hashes)`` tokens).  Those tokens are *issued*.  A
later completed call of the same tenant *uses* the leading blocks its prompt chain shares with the
staged chain (chained hashes, ``clairvoyant.core.blockhash``); when every full block is shared and
the prompt is at least as long, the partial tail counts as used too.  A speculation's used tokens
are the most any one call used.  What is unused is *wasted* when the speculation closes: its
workflow ended, expired or was evicted, or it is older than the workflow idle TTL (a speculation
without a workflow, or for one the history never held), or it is pushed out past ``max_pending``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes, common_prefix
from clairvoyant.policy.cache import CacheDirective

_K = TypeVar("_K", int, str)


@dataclass(slots=True)
class _Speculation:
    tenant: str
    workflow_id: str
    tokens: int
    hashes: tuple[int, ...]
    issued: float
    used: int = 0


class SpeculationTotals(NamedTuple):
    issued_tokens: int
    used_tokens: int
    wasted_tokens: int
    pending: int  # speculations not closed yet


class SpeculationBook:
    """See the module docstring."""

    def __init__(self, *, max_age_s: float, max_pending: int = 65536) -> None:
        self.max_age_s = max_age_s
        self.max_pending = max_pending
        self.issued_tokens = 0
        self.used_tokens = 0
        self.wasted_tokens = 0
        self._pending: OrderedDict[int, _Speculation] = OrderedDict()  # oldest first
        self._by_head: dict[tuple[str, int], list[int]] = {}  # (tenant, first hash) -> ids
        self._by_workflow: dict[tuple[str, str], list[int]] = {}  # (tenant, workflow id) -> ids
        self._next_id = 0

    def issue(self, directive: CacheDirective, now: float) -> None:
        """Account one directive (a non-speculative one is ignored)."""
        if not directive.speculative:
            return
        if directive.token_ids:
            tokens, hashes = len(directive.token_ids), tuple(chain_hashes(directive.token_ids))
        else:
            tokens, hashes = BLOCK_TOKENS * len(directive.block_hashes), directive.block_hashes
        if tokens == 0:
            return
        self.issued_tokens += tokens
        ident, self._next_id = self._next_id, self._next_id + 1
        self._pending[ident] = _Speculation(directive.tenant, directive.workflow_id, tokens, hashes, now)
        if hashes:
            self._by_head.setdefault((directive.tenant, hashes[0]), []).append(ident)
        self._by_workflow.setdefault((directive.tenant, directive.workflow_id), []).append(ident)
        while len(self._pending) > self.max_pending:
            self._close(next(iter(self._pending)))

    def observe(self, tenant: str, prompt_hashes: Sequence[int], prompt_tokens: int) -> None:
        """A call of ``tenant`` with this prompt chain completed: credit what it used."""
        if not prompt_hashes:
            return
        length = max(prompt_tokens, BLOCK_TOKENS * len(prompt_hashes))
        for ident in self._by_head.get((tenant, prompt_hashes[0]), ()):
            spec = self._pending[ident]
            shared = common_prefix(spec.hashes, prompt_hashes)
            used = BLOCK_TOKENS * shared
            if shared == len(spec.hashes) and length >= spec.tokens:
                used = spec.tokens
            if used > spec.used:
                self.used_tokens += used - spec.used
                spec.used = used

    def close_workflow(self, tenant: str, workflow_id: str) -> None:
        """The workflow is gone: its speculations' unused tokens are wasted."""
        for ident in list(self._by_workflow.get((tenant, workflow_id), ())):
            self._close(ident)

    def expire(self, now: float) -> None:
        """Close the speculations older than ``max_age_s``."""
        while self._pending:
            ident, spec = next(iter(self._pending.items()))
            if spec.issued + self.max_age_s > now:
                break
            self._close(ident)

    def totals(self) -> SpeculationTotals:
        return SpeculationTotals(self.issued_tokens, self.used_tokens, self.wasted_tokens, len(self._pending))

    def _close(self, ident: int) -> None:
        spec = self._pending.pop(ident)
        self.wasted_tokens += spec.tokens - spec.used
        _unlist(self._by_workflow, (spec.tenant, spec.workflow_id), ident)
        if spec.hashes:
            _unlist(self._by_head, (spec.tenant, spec.hashes[0]), ident)

    def check_integrity(self) -> None:
        heads = sorted(i for ids in self._by_head.values() for i in ids)
        assert heads == sorted(i for i, s in self._pending.items() if s.hashes), "head map drifted"
        assert sorted(i for ids in self._by_workflow.values() for i in ids) == sorted(self._pending), (
            "workflow map drifted"
        )
        assert self.used_tokens + self.wasted_tokens <= self.issued_tokens, "used + wasted > issued"


def _unlist(table: dict[tuple[str, _K], list[int]], key: tuple[str, _K], ident: int) -> None:
    ids = table[key]
    ids.remove(ident)
    if not ids:
        del table[key]
