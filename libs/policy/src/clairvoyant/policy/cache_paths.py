"""What the cache policies read from the profiler's texts, and the helpers they share.

* ``agents_in_path(text)``: the agent ids a bounded path expression names (the grammar is the
  profiler's, ``profiler/core/expr.py``; the policy package cannot import the profiler, so this is
  a scanner, not a parser: it never raises, and on text outside the grammar it returns the names it
  can read).
* ``template_sources(template)``: the agents a prompt-composition template copies from
  (``${engineer[-1]:prompt:[0,$]}`` names ``engineer``; ``${static:...}`` and ``${new}`` name none),
  read with the shared template parser (``clairvoyant.core.templates``).
* ``BoundedMap``: an insertion-ordered dict that forgets its oldest entries past a size, the one
  shape of per-workflow state every policy keeps.
* ``by_worker``, ``worker_of``, ``most_resident``, ``prompt_hashes``: building directives per
  worker and reading the view, the same way in every policy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from clairvoyant.core.blockhash import chain_hashes
from clairvoyant.core.templates import parse as parse_template
from clairvoyant.policy.cache import CacheDirective, CacheView, DirectiveKind, Residency, Tier, WorkerLoad

_AGENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:@/+=-")

K = TypeVar("K")
V = TypeVar("V")


def agents_in_path(text: str) -> frozenset[str]:
    """Every agent id in the path expression ``text``.  Bounds (``{2,3}``), ``$``, brackets and
    operators are skipped; an agent name ends at any other character and at ``->``."""
    names: set[str] = set()
    pos, size = 0, len(text)
    while pos < size:
        char = text[pos]
        if char == "{":  # a bound's integers are not agents
            close = text.find("}", pos)
            pos = size if close < 0 else close + 1
        elif char in _AGENT_CHARS and not text.startswith("->", pos):
            end = pos
            while end < size and text[end] in _AGENT_CHARS and not text.startswith("->", end):
                end += 1
            names.add(text[pos:end])
            pos = end
        else:
            pos += 2 if text.startswith("->", pos) else 1
    return frozenset(names)


def template_sources(template: str) -> frozenset[str]:
    """The agents whose earlier calls ``template`` copies a prefix from (none for "" or a text
    outside the template grammar)."""
    try:
        parsed = parse_template(template)
    except ValueError:
        return frozenset()
    return frozenset(segment.agent for segment in parsed.segments if segment.part != "static")


class BoundedMap(OrderedDict[K, V], Generic[K, V]):
    """A dict of at most ``limit`` entries: setting a key makes it the newest, and the oldest go
    first when the limit is passed."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError("BoundedMap needs a limit >= 1")
        self.limit = limit

    def __setitem__(self, key: K, value: V) -> None:
        if key in self:
            self.move_to_end(key)
        super().__setitem__(key, value)
        while len(self) > self.limit:
            self.popitem(last=False)


def worker_of(view: CacheView, model: str, worker_id: str) -> WorkerLoad | None:
    """``worker_id``'s last load report among ``model``'s live workers; None when it is gone."""
    return next((w for w in view.workers(model) if w.worker_id == worker_id), None)


def prompt_hashes(token_ids: Sequence[int]) -> tuple[int, ...]:
    """The chained block hashes of a prompt (its whole blocks)."""
    return tuple(chain_hashes(token_ids))


def most_resident(residency: Iterable[Residency], tier: Tier) -> int:
    """The longest leading run any worker holds down to ``tier`` (3: shared storage counts)."""
    field = {1: 0, 2: 1, 3: 2}[tier]
    return max(((r.l1_blocks, r.l2_blocks, r.l3_blocks)[field] for r in residency), default=0)


def by_worker(
    kind: DirectiveKind,
    entries: Iterable[tuple[str, int]],
    *,
    tenant: str,
    workflow_id: str = "",
    ttl_s: float | None = None,
    target_tier: Tier | None = None,
    reason: str = "",
) -> list[CacheDirective]:
    """One ``kind`` directive per worker over the hashes ``entries`` (worker, hash) names, workers
    and hashes sorted (directives are deterministic)."""
    hashes: dict[str, set[int]] = {}
    for worker_id, block_hash in entries:
        hashes.setdefault(worker_id, set()).add(block_hash)
    return [
        CacheDirective(
            kind,
            worker_id,
            tenant,
            workflow_id=workflow_id,
            block_hashes=tuple(sorted(chosen)),
            ttl_s=ttl_s,
            target_tier=target_tier,
            reason=reason,
        )
        for worker_id, chosen in sorted(hashes.items())
    ]


__all__ = [
    "BoundedMap",
    "agents_in_path",
    "by_worker",
    "most_resident",
    "prompt_hashes",
    "template_sources",
    "worker_of",
]
