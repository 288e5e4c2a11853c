"""The KV block access trace of a run: its completed calls, as reads and writes of block chains.

A call reads its prompt's block chain on its worker at ``start`` (each block a hit or a miss) and
writes its response's chain at ``end``:

    call c on worker w:   start ──read  prompt_block_hashes──> ... ──write response_block_hashes──> end

``AccessTrace.of(calls, scope)`` orders those events by time (a write before a read at the same
instant: a dependent may start the moment its parent ends) and names the cache each one goes to:
the call's worker (``scope="worker"``, one cache per worker) or ``CLUSTER`` (``scope="cluster"``,
the whole cluster as one cache).  The replay (``replay_cache.py``) runs caches over it.

A simulated run's calls come from ``Simulator(..., record_completions=True).completions``; a
live run's from the completion records (``cv.requests.completed``).  ``start`` is the call's
arrival, as its completion record has it: the read is placed there, before any queueing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, NamedTuple

from clairvoyant.policy.cache import CompletedCall

Scope = Literal["worker", "cluster"]
SCOPES: tuple[Scope, ...] = ("worker", "cluster")
CLUSTER = "cluster"  # the cache of the cluster scope


class Access(NamedTuple):
    """One call's read of its prompt chain or write of its response chain, on one cache."""

    time: float
    cache: str  # the worker id, or CLUSTER
    call: int  # index in ``AccessTrace.calls``
    write: bool  # False: the prompt is read at the call's start; True: the response written at its end
    blocks: tuple[int, ...]


class AccessTrace(NamedTuple):
    calls: tuple[CompletedCall, ...]
    accesses: tuple[Access, ...]  # in time order
    scope: Scope

    @classmethod
    def of(cls, calls: Iterable[CompletedCall], scope: Scope = "worker") -> AccessTrace:
        """The trace of ``calls``: each one's read at its start and write at its end (also when a
        chain is empty; the write then only marks its completion).  Raises ValueError for an
        unknown scope."""
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; choose from {', '.join(SCOPES)}")
        ordered = tuple(calls)
        events: list[tuple[float, int, int, Access]] = []
        for index, call in enumerate(ordered):
            cache = call.worker_id if scope == "worker" else CLUSTER
            # Every call has both, even with an empty chain: the write marks its completion.
            events.append(
                (call.start, 1, index, Access(call.start, cache, index, False, call.prompt_block_hashes))
            )
            events.append(
                (call.end, 0, index, Access(call.end, cache, index, True, call.response_block_hashes))
            )
        events.sort(key=lambda event: event[:3])
        return cls(ordered, tuple(event[3] for event in events), scope)

    def caches(self) -> list[str]:
        """The caches the trace touches, in order of first access."""
        return list(dict.fromkeys(access.cache for access in self.accesses))

    def reads(self) -> int:
        """Block reads (the accesses a replay counts as hits or misses)."""
        return sum(len(access.blocks) for access in self.accesses if not access.write)

    def working_set(self) -> int:
        """The most distinct blocks any one cache of the trace sees: the capacity past which no
        block ever needs evicting."""
        seen: dict[str, set[int]] = {}
        for access in self.accesses:
            seen.setdefault(access.cache, set()).update(access.blocks)
        return max((len(blocks) for blocks in seen.values()), default=0)


__all__ = ["CLUSTER", "SCOPES", "Access", "AccessTrace", "Scope"]
