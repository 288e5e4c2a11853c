"""The process table (Autellix §4.2.1): what the scheduler knows about each running program.

A program is a workflow instance, keyed by (tenant, workflow_id); requests without app_metadata
belong to no program.  The global scheduler keeps the table up to date; policies only read it:

    submit ──> entry created, call active, its ATLAS priority fixed (Eq. 2 / Alg. 1 line 11)
    complete ─> service += t (PLAS, Eq. 1); critical path = max(path, p(c) + t) (ATLAS, line 4);
                waiting += the call's time not served; the entry ends with a workflow_end call
    expire ───> entries with no active call, idle for longer than the TTL, are dropped

Pure and clock-free like the rest of the core: every update takes the time it happens at.

A policy whose priority reads only a program's entry can follow the updates instead of re-reading
every entry: ``subscribe()`` gives a ``ChangeFeed`` that collects the keys of the entries each
update touches (created, changed or dropped), until the policy ``take``s them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from clairvoyant.policy.types import Completion, QueuedRequest

ProgramKey = tuple[str, str]  # (tenant, workflow_id)


def program_key(request: QueuedRequest) -> ProgramKey | None:
    """The program a request belongs to; None without app_metadata."""
    meta = request.app_metadata
    return None if meta is None else (request.tenant, meta.workflow_id)


@dataclass
class Program:
    """One entry.  Service and waiting are in the units ``Completion`` reports (seconds)."""

    key: ProgramKey
    service_s: float = 0.0  # PLAS: total service of its completed calls
    critical_path_s: float = 0.0  # ATLAS: the longest completed chain observed (p(c) + t_c)
    waiting_s: float = 0.0  # completed calls' time between arrival and finish not spent served
    engine_id: str | None = None  # the engine Alg. 2 pins its long calls to
    active: dict[str, float] = field(default_factory=dict)  # call id -> arrival time (its threads)
    call_priority: dict[str, float] = field(default_factory=dict)  # active call -> ATLAS p(c)
    path_end: dict[str, float] = field(default_factory=dict)  # completed call -> p(c) + t_c
    # Every call submitted -> its depth in the workflow's DAG (topo-depth): 0 without parents, else
    # 1 + the deepest parent's (a parent never submitted here counts as 0).  Fixed at first submit.
    call_depth: dict[str, int] = field(default_factory=dict)
    last_arrival: float = 0.0
    last_completion: float = 0.0
    first_arrival: float = math.inf  # the earliest arrival_time of a call submitted to this entry
    rank: int = 0  # the entry's place in the order entries were opened (0 first), for tie-breaks

    @property
    def last_activity(self) -> float:
        return max(self.last_arrival, self.last_completion)


class ChangeFeed:
    """The keys of the entries touched since the last ``take`` (``ProcessTable.subscribe``).

    Every update the scheduler makes counts (submit, cancel, complete, end, expiry), whether or
    not the values a given policy reads changed; a routing policy's own writes (``engine_id``)
    do not."""

    def __init__(self) -> None:
        self._keys: set[ProgramKey] = set()

    def add(self, key: ProgramKey) -> None:
        self._keys.add(key)

    def take(self) -> set[ProgramKey]:
        keys, self._keys = self._keys, set()
        return keys


class ProcessTable:
    def __init__(self, idle_ttl_s: float = 600.0) -> None:
        """``idle_ttl_s``: an entry with no active call is dropped after this long without activity
        (Autellix tracks the most recent arrival and completion "for stale programs")."""
        self.idle_ttl_s = idle_ttl_s
        self._programs: dict[ProgramKey, Program] = {}
        self._opened = 0  # entries opened so far (``Program.rank``)
        self._feeds: list[ChangeFeed] = []

    def subscribe(self) -> ChangeFeed:
        """A feed of the keys every later update touches; it lives as long as the table."""
        feed = ChangeFeed()
        self._feeds.append(feed)
        return feed

    def _touch(self, key: ProgramKey) -> None:
        for feed in self._feeds:
            feed.add(key)

    def get(self, key: ProgramKey | None) -> Program | None:
        return None if key is None else self._programs.get(key)

    def of(self, request: QueuedRequest) -> Program | None:
        return self.get(program_key(request))

    def __len__(self) -> int:
        return len(self._programs)

    def atlas_priority(self, request: QueuedRequest) -> float:
        """p(c) as fixed when the call arrived; 0 for calls outside the table (Eq. 2's root)."""
        program = self.of(request)
        return 0.0 if program is None else program.call_priority.get(request.request_id, 0.0)

    # ---- updates (the global scheduler calls these) --------------------------------------------

    def on_submit(self, request: QueuedRequest, now: float) -> None:
        """A call arrived: open the entry if new, record the thread and fix its ATLAS priority.

        Eq. 2 when parent ids are given and at least one parent completed in this program:
        p(c) = max over those parents of p(parent) + t(parent).  Otherwise the program's scalar,
        the longest critical path observed so far (Alg. 1 line 11; 0 for a program's first call).
        """
        key = program_key(request)
        if key is None:
            return
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = Program(key, rank=self._opened)
            self._opened += 1
        assert request.app_metadata is not None
        known = [
            program.path_end[p] for p in request.app_metadata.parent_request_ids if p in program.path_end
        ]
        program.call_priority[request.request_id] = max(known) if known else program.critical_path_s
        if request.request_id not in program.call_depth:
            parents = request.app_metadata.parent_request_ids
            depths = program.call_depth
            depths[request.request_id] = 1 + max((depths.get(p, 0) for p in parents), default=-1)
        program.active[request.request_id] = request.arrival_time
        program.first_arrival = min(program.first_arrival, request.arrival_time)
        program.last_arrival = now
        self._touch(key)

    def on_cancel(self, request: QueuedRequest) -> None:
        program = self.of(request)
        if program is not None:
            program.active.pop(request.request_id, None)
            program.call_priority.pop(request.request_id, None)
            self._touch(program.key)

    def on_complete(self, completion: Completion) -> None:
        """Alg. 1 UPDATE_PROCESS_TABLE; a call flagged workflow_end closes its program."""
        request = completion.request
        program = self.of(request)
        if program is None:
            return
        arrival = program.active.pop(request.request_id, request.arrival_time)
        priority = program.call_priority.pop(request.request_id, program.critical_path_s)
        service = max(0.0, completion.service_s)
        program.service_s += service
        program.path_end[request.request_id] = priority + service
        program.critical_path_s = max(program.critical_path_s, priority + service)
        program.waiting_s += max(0.0, completion.finish_time - arrival - service)
        program.last_completion = completion.finish_time
        self._touch(program.key)
        meta = request.app_metadata
        if meta is not None and meta.workflow_end and not program.active:
            del self._programs[program.key]

    def end(self, key: ProgramKey) -> bool:
        """The program ended (Autellix's end_session).  False if it had no entry."""
        if self._programs.pop(key, None) is None:
            return False
        self._touch(key)
        return True

    def expire(self, now: float) -> list[ProgramKey]:
        """Drop idle entries: no active call and no activity for more than ``idle_ttl_s``."""
        stale = [
            key
            for key, p in self._programs.items()
            if not p.active and now - p.last_activity > self.idle_ttl_s
        ]
        for key in stale:
            del self._programs[key]
            self._touch(key)
        return stale

    def check_integrity(self) -> None:
        for key, program in self._programs.items():
            assert program.key == key
            assert set(program.call_priority) <= set(program.active), f"{key}: priority of an inactive call"
            assert all(program.first_arrival <= t for t in program.active.values()), f"{key}: first arrival"
            assert program.service_s >= 0 and program.waiting_s >= 0
            assert program.critical_path_s <= program.service_s + 1e-9, f"{key}: path longer than service"
