"""The event queue: virtual time, with a fixed order among events at the same instant.

At one instant, completions are handled first, then arrivals and calls becoming ready, and only
then do replicas start their next step, so that everything that became runnable at ``t`` can join
the step that starts at ``t``.  Ties within a phase keep insertion order, which makes runs
byte-for-byte reproducible.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from enum import IntEnum


class Phase(IntEnum):
    STEP_DONE = 0  # a replica's step finished: outputs are delivered
    READY = 1  # a workflow arrives, or a call's dependencies (and tools) are done
    STEP_START = 2  # a replica starts its next step


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, time: float, phase: Phase, action: Callable[[], None]) -> None:
        if time < self.now:
            raise ValueError(f"cannot schedule at {time} before now ({self.now})")
        heapq.heappush(self._heap, (time, int(phase), next(self._seq), action))

    def run(self, until: float = float("inf")) -> int:
        """Process events in order until none is left (or ``until``); returns how many ran."""
        processed = 0
        while self._heap and self._heap[0][0] <= until:
            time, _, _, action = heapq.heappop(self._heap)
            self.now = time
            action()
            processed += 1
        return processed

    def next_time(self) -> float | None:
        """When the next event is due; None when none is left."""
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
