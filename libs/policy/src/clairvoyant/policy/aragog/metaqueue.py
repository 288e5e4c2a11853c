"""Aragog's meta-queue (seeds/002 §3.2): one model group's waiting calls in FIFO order, kept so a
scheduling round walks only the calls that could use a model with a free slot.

A call's place is its ``order``, (workflow rank, -depth, sequence): FIFO across workflows by their
first arrival, then within a workflow deepest agent first, then arrival.  The calls are bucketed by
the set of models each may run on now (at most one bucket per subset of the group's models), each
bucket a list sorted by order; ``walk`` merges the buckets that meet the models with free slots.

    bucket {7b, 14b}:  (0,-2,0) a   (3,0,9) f
    bucket {32b}:      (1,0,4) c                     walk({32b, 14b}) -> a, c, f
    bucket {7b}:       (2,-1,5) d                    (d is never looked at)
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator, Set

Order = tuple[int, int, int]  # (workflow rank, -depth, sequence)


class MetaQueue:
    def __init__(self) -> None:
        self._buckets: dict[frozenset[str], list[tuple[Order, str]]] = {}
        self._where: dict[str, tuple[frozenset[str], Order]] = {}  # request id -> its bucket and order

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._where

    def add(self, request_id: str, order: Order, models: frozenset[str]) -> None:
        """Queue a call that may run on ``models``.  Raises ValueError when it is already queued."""
        if request_id in self._where:
            raise ValueError(f"{request_id!r} is already in the meta-queue")
        bisect.insort(self._buckets.setdefault(models, []), (order, request_id))
        self._where[request_id] = (models, order)

    def remove(self, request_id: str) -> bool:
        """Take a call out; False when it is not queued."""
        found = self._where.pop(request_id, None)
        if found is None:
            return False
        models, order = found
        bucket = self._buckets[models]
        del bucket[bisect.bisect_left(bucket, (order, request_id))]
        if not bucket:
            del self._buckets[models]
        return True

    def move(self, request_id: str, models: frozenset[str]) -> None:
        """The call may now run on ``models`` (its workflow's set shrank); it keeps its order."""
        models_now, order = self._where[request_id]
        if models_now != models:
            self.remove(request_id)
            self.add(request_id, order, models)

    def walk(self, free_models: Set[str]) -> Iterator[str]:
        """The calls that may run on one of ``free_models``, in meta-queue order.  Lazy: the caller
        stops when it has what it needs; the queue must not change while it walks."""
        buckets = [bucket for models, bucket in self._buckets.items() if not models.isdisjoint(free_models)]
        if not buckets:
            return iter(())
        merged = buckets[0] if len(buckets) == 1 else heapq.merge(*buckets)
        return (request_id for _, request_id in merged)

    def check_integrity(self) -> None:
        counted = 0
        for models, bucket in self._buckets.items():
            assert bucket and bucket == sorted(bucket), f"bucket {sorted(models)} empty or out of order"
            for order, request_id in bucket:
                assert self._where.get(request_id) == (models, order), f"{request_id} misfiled"
            counted += len(bucket)
        assert counted == len(self._where)
