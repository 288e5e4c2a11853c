"""ThunderAgent's program-aware scheduler (Kang et al., 2026, "ThunderAgent: A Simple, Fast and
Program-Aware Agentic Inference System") as Pythia ran it (seeds/000 §7: one queue per model, a
0.5 s scheduling interval instead of 5 s): the ``thunderagent`` preset.

The paper's §4.3.1 (periodic thrashing check, Restore and Pause, shortest first, Eqs. 6, 7, 10, 11)
and §4.3.2 (one waiting queue shared by the backends), as its code does them: read from
github.com/ThunderAgent-org/ThunderAgent at a7eef77 (``ThunderAgent/scheduler/router.py``,
``backend/state.py``, ``program/state.py``, ``config.py``).  Where paper and code differ, the code
wins; docs/scheduling.md ("thunderagent") maps each rule to its source and lists the readings.

    call arrives ──> first call of a program: admitted to the worker with the fewest program tokens
                     if the model's paused queue is empty and the program fits; else paused
                     later calls: an admitted program's go to its worker, a paused one's wait
    call ends ────> the program is ACTING (its tool runs) and keeps its tokens on its worker;
                     one marked for pause is paused now, at the tool boundary
    every 0.5 s ──> resume paused programs (best fit decreasing), then on each worker over its KV
                     capacity pause ACTING programs, smallest first, then mark REASONING ones

The routing policy keeps the state (``ProgramGate``); the priority policy reads it, through the
process table that the scheduler binds both to, to rank admitted programs' calls first.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clairvoyant.core.blockhash import BLOCK_TOKENS
from clairvoyant.policy.baselines import ROUTER_QUEUE_FACTOR
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable, ProgramKey, program_key
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    PriorityChanges,
    SchedulerView,
    eligible_workers,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

_SLACK = 1e-9  # virtual times are floats: a tick due at 1.5 runs at 1.4999999999


@dataclass(frozen=True, slots=True)
class ThunderAgentConfig:
    """ThunderAgent's parameters; defaults are its ``config.py`` and ``backend/state.py`` values,
    except the interval, which Pythia set to 0.5 s (ThunderAgent's default: 5 s).

    interval_s: the periodic check (resume, then pause) runs every interval_s on a fixed grid.
    acting_token_weight: an ACTING program's tokens count this much (``acting_token_weight``).
    buffer_per_program: tokens reserved per registered program (``BUFFER_PER_PROGRAM``).
    wait_timeout_s: a call of a paused program waiting this long forces a resume (``_wait_for_resume``).
    count_marked_as_released: False (the released code): while a worker is over capacity, marking a
      REASONING program does not lower its overflow, so every REASONING program there is marked.
      True: stop once the marked programs' tokens cover the overflow (the code before 5850bc5).
    acting_token_decay: the resume pass counts an ACTING program's tokens x 2^(-seconds acting)
      (``--use-acting-token-decay``: off by default in the code, on in the paper's evaluation, §5.1).
    engine_queue_factor: placements held per worker, x max_batch (the other router baselines' cap).
    """

    interval_s: float = 0.5
    acting_token_weight: float = 1.0
    buffer_per_program: int = 100
    wait_timeout_s: float = 1800.0
    count_marked_as_released: bool = False
    acting_token_decay: bool = False
    engine_queue_factor: float = ROUTER_QUEUE_FACTOR

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {self.interval_s}")
        if self.acting_token_weight < 0:
            raise ValueError(f"acting_token_weight must be >= 0, got {self.acting_token_weight}")
        if self.buffer_per_program < 0:
            raise ValueError(f"buffer_per_program must be >= 0, got {self.buffer_per_program}")
        if not self.wait_timeout_s > 0:
            raise ValueError(f"wait_timeout_s must be positive, got {self.wait_timeout_s}")
        if self.engine_queue_factor < 1:
            raise ValueError(f"engine_queue_factor must be at least 1, got {self.engine_queue_factor}")


@dataclass(slots=True)
class GatedProgram:
    """One program on one model (ThunderAgent's ``Program``, one per model's queue)."""

    key: ProgramKey
    model: str
    worker_id: str | None = None  # the worker it is registered on; None while paused
    origin: str | None = None  # the worker it was paused from (None: paused as a new program)
    paused: bool = False
    tokens: int = 0  # the prompt tokens of its latest call
    steps: int = 0  # calls seen on this model
    calls: dict[str, None] = field(default_factory=dict)  # its calls queued or placed: REASONING iff any
    marked: bool = False  # pause at its next tool boundary
    waiting_since: float | None = None  # while paused with a call waiting: that call's arrival
    paused_tokens: int = 0  # tokens when paused (the paused pool's sort key)
    acting_since: float | None = None  # when its last call ended (None: never ended one)

    @property
    def reasoning(self) -> bool:
        return bool(self.calls)


@dataclass
class _ModelPool:
    """One model's programs (in creation order) and its paused queue (in pause order)."""

    programs: dict[ProgramKey, GatedProgram] = field(default_factory=dict)
    paused: dict[ProgramKey, None] = field(default_factory=dict)


@dataclass(slots=True)
class _Free:
    """A worker's free tokens during one resume pass."""

    worker_id: str
    tokens: float


def _capacity(worker: WorkerView) -> int | None:
    """KV tokens of the worker's pool; None when it reports none (ThunderAgent: no cache config)."""
    if worker.kv_blocks_total <= 0:
        return None
    return worker.kv_blocks_total * (worker.block_size or BLOCK_TOKENS)


class ProgramGate:
    """ThunderAgent's router state for one scheduler: which programs are registered on which
    worker, which are paused, and when the periodic check runs.  ``sync`` brings it up to date
    with the process table (arrivals, completions, ended programs) and runs what is due."""

    def __init__(self, table: ProcessTable, config: ThunderAgentConfig) -> None:
        self.config = config
        self.table = table
        self._feed = table.subscribe()
        self.scheduler: SchedulerView | None = None
        self._pools: dict[str, _ModelPool] = {}
        self._calls: dict[ProgramKey, dict[str, str]] = {}  # program -> its tracked call ids -> model
        self._changed: set[ProgramKey] = set()  # programs whose admission changed (for the priority)
        self._tick_at: float | None = None

    # ---- reads ------------------------------------------------------------------------------

    def program(self, model: str, key: ProgramKey | None) -> GatedProgram | None:
        pool = self._pools.get(model)
        return None if pool is None or key is None else pool.programs.get(key)

    def is_paused(self, request: QueuedRequest) -> bool:
        program = self.program(request.model, program_key(request))
        return program is not None and program.paused

    def paused_queue(self, model: str) -> list[ProgramKey]:
        pool = self._pools.get(model)
        return [] if pool is None else list(pool.paused)

    def take_changed(self) -> set[ProgramKey]:
        changed, self._changed = self._changed, set()
        return changed

    def remaining(self, worker: WorkerView) -> float:
        """Capacity - (REASONING tokens + weight x ACTING tokens + buffer x programs); infinite
        without a reported pool.  ThunderAgent also subtracts prefix-shared tokens, but never
        updates them from 0 (``update_shared_tokens`` has no caller)."""
        capacity = _capacity(worker)
        if capacity is None:
            return math.inf
        programs = self._on(worker.model, worker.worker_id)
        return capacity - self._active_tokens(programs) - len(programs) * self.config.buffer_per_program

    def wake_at(self, now: float) -> float | None:
        """The next periodic check while it has work (a paused program, a worker over capacity),
        or the earliest forced resume."""
        self._schedule_tick(now)
        deadlines = [
            p.waiting_since + self.config.wait_timeout_s
            for pool in self._pools.values()
            for p in (pool.programs[k] for k in pool.paused)
            if p.waiting_since is not None
        ]
        times = [t for t in (self._tick_at, min(deadlines, default=None)) if t is not None and t > now]
        return min(times, default=None)

    # ---- updates ----------------------------------------------------------------------------

    def sync(self, now: float) -> None:
        """Apply what the process table saw since the last sync, in ThunderAgent's order
        (ended calls, ended programs, arrivals by arrival time), then the forced resumes and the
        periodic check when due."""
        assert self.scheduler is not None, "ProgramGate.sync before bind_scheduler"
        arrivals: list[tuple[float, ProgramKey, int, QueuedRequest]] = []
        for key in sorted(self._feed.take()):
            entry = self.table.get(key)
            live = entry.active if entry is not None else {}
            tracked = self._calls.get(key, {})
            for call_id in [c for c in tracked if c not in live]:
                self._call_ended(key, tracked.pop(call_id), call_id, now)
            fresh = [c for c in live if c not in tracked]
            if fresh:
                queued = {r.request_id: r for r in self.scheduler.queued_calls(key)}
                arrivals += [
                    (queued[c].arrival_time, key, i, queued[c]) for i, c in enumerate(fresh) if c in queued
                ]
            if entry is None:
                self._release(key)
        for _, _, _, request in sorted(arrivals, key=lambda a: a[:3]):
            self._arrived(request)
        self._force_overdue(now)
        if self._tick_at is not None and now >= self._tick_at - _SLACK:
            self._tick_at = None
            for model in sorted(self._pools):
                self._resume_greedily(model, now)
                self._pause_until_safe(model)
        self._schedule_tick(now)

    def rehome(self, program: GatedProgram, worker_id: str) -> None:
        """Register an admitted program on another worker (its own is gone, draining or excluded)."""
        program.worker_id = worker_id

    def least_tokens(self, candidates: Iterable[WorkerView]) -> WorkerView | None:
        """The candidate with the fewest active program tokens, then the smallest id
        (``_select_backend_for_new_program``'s order: first in the backend list on a tie)."""
        best: tuple[float, str] | None = None
        chosen = None
        for worker in candidates:
            key = (self._active_tokens(self._on(worker.model, worker.worker_id)), worker.worker_id)
            if best is None or key < best:
                best, chosen = key, worker
        return chosen

    def check_integrity(self) -> None:
        for model, pool in self._pools.items():
            assert {k for k, p in pool.programs.items() if p.paused} == set(pool.paused), model
            for key, program in pool.programs.items():
                assert program.key == key and program.model == model
                assert program.paused == (program.worker_id is None), f"{key}: paused iff unregistered"
                assert not (program.marked and (program.paused or not program.calls)), f"{key}: stale mark"
                tracked = self._calls.get(key, {})
                assert all(tracked.get(c) == model for c in program.calls), f"{key}: untracked call"

    # ---- ThunderAgent's steps ---------------------------------------------------------------

    def _arrived(self, request: QueuedRequest) -> None:
        """``update_program_before_request``: count the step, estimate the tokens; a new program
        is admitted (step 2) or queued; a paused one's call waits for its resume (step 1)."""
        key = program_key(request)
        assert key is not None
        pool = self._pools.setdefault(request.model, _ModelPool())
        program = pool.programs.get(key)
        if program is None:
            program = pool.programs[key] = GatedProgram(key, request.model)
        self._calls.setdefault(key, {})[request.request_id] = request.model
        program.steps += 1
        program.tokens = request.prompt_tokens
        program.calls[request.request_id] = None
        program.acting_since = None
        if program.paused:
            if program.waiting_since is None:
                program.waiting_since = request.arrival_time
        elif program.worker_id is None:
            worker = None if pool.paused else self._worker_for_new(request.model, program.tokens)
            if worker is not None:
                self._register(pool, program, worker.worker_id)
            else:
                self._pause(pool, program)
                program.waiting_since = request.arrival_time

    def _call_ended(self, key: ProgramKey, model: str, call_id: str, now: float) -> None:
        """``update_program_after_request``: with no call left the program is ACTING; a marked
        one is paused now (its tokens leave its worker)."""
        pool = self._pools.get(model)
        program = pool.programs.get(key) if pool is not None else None
        if pool is None or program is None:
            return
        program.calls.pop(call_id, None)
        if program.calls:
            return
        program.waiting_since, program.acting_since = None, now
        if program.marked:
            program.marked = False
            self._pause(pool, program)

    def _release(self, key: ProgramKey) -> None:
        """``release_program``: the program ended (its process-table entry is gone)."""
        self._calls.pop(key, None)
        for pool in self._pools.values():
            if pool.programs.pop(key, None) is not None:
                pool.paused.pop(key, None)
                self._changed.add(key)

    def _worker_for_new(self, model: str, tokens: int) -> WorkerView | None:
        """``_select_backend_for_new_program``: the healthy worker with the fewest active program
        tokens among those with room for tokens + buffer; None: the program waits."""
        need = tokens + self.config.buffer_per_program
        return self.least_tokens(w for w in self._healthy(model) if self.remaining(w) >= need)

    def _resume_greedily(self, model: str, now: float) -> None:
        """``_greedy_resume``: choose, in priority order (REASONING with step > 1, then new, then
        ACTING; each by tokens at pause, ascending), the programs whose tokens + buffer fit in the
        workers' total free tokens; place them largest first on the worker with the most free
        tokens (best fit decreasing), skipping one that fits nowhere."""
        pool = self._pools[model]
        buffer = self.config.buffer_per_program
        remaining = self._decayed_remaining if self.config.acting_token_decay else self._remaining_at
        free = [
            _Free(w.worker_id, remaining(w, now)) for w in self._healthy(model) if _capacity(w) is not None
        ]
        free = [f for f in free if f.tokens > buffer]
        if not free or not pool.paused:
            return
        waiting = sorted((pool.programs[k] for k in pool.paused), key=lambda p: p.paused_tokens)
        new = [p for p in waiting if p.steps == 1]
        reasoning = [p for p in waiting if p.steps != 1 and p.reasoning]
        acting = [p for p in waiting if p.steps != 1 and not p.reasoning]
        total, chosen, used = sum(f.tokens for f in free), [], 0.0
        for program in reasoning + new + acting:
            if used + program.tokens + buffer <= total:
                chosen.append(program)
                used += program.tokens + buffer
        if not chosen:
            return
        chosen.sort(key=lambda p: -p.tokens)
        free.sort(key=lambda f: -f.tokens)
        smallest = chosen[-1].tokens + buffer
        for program in chosen:
            if not free or smallest > free[0].tokens:
                break
            need = program.tokens + buffer
            if need > free[0].tokens:
                continue
            self._register(pool, program, free[0].worker_id)
            free[0].tokens -= need
            if free[0].tokens > buffer:
                free.sort(key=lambda f: -f.tokens)
            else:
                free.pop(0)

    def _pause_until_safe(self, model: str) -> None:
        """``_pause_until_safe`` on every worker of the model over capacity: pause its smallest
        ACTING program, else mark its smallest unmarked REASONING one, until it is within capacity
        (marks count only with ``count_marked_as_released``) or nothing is left."""
        pool = self._pools[model]
        for worker in self._live(model):
            if _capacity(worker) is None:
                continue
            while self._overflow(worker) > 0:
                programs = self._on(model, worker.worker_id)
                acting = sorted((p for p in programs if not p.reasoning), key=lambda p: p.tokens)
                if acting:
                    self._pause(pool, acting[0])
                    continue
                reasoning = sorted(
                    (p for p in programs if p.reasoning and not p.marked), key=lambda p: p.tokens
                )
                if not reasoning:
                    break
                reasoning[0].marked = True

    def _force_overdue(self, now: float) -> None:
        """``_wait_for_resume``'s timeout: resume a program whose call waited wait_timeout_s, on its
        origin worker, or (a new program, or an origin gone) the healthy one with fewest programs."""
        for model, pool in sorted(self._pools.items()):
            for key in list(pool.paused):
                program = pool.programs[key]
                if (
                    program.waiting_since is None
                    or now < program.waiting_since + self.config.wait_timeout_s - _SLACK
                ):
                    continue
                healthy = self._healthy(model)
                target = next((w.worker_id for w in healthy if w.worker_id == program.origin), None)
                if target is None and healthy:
                    target = min(
                        healthy, key=lambda w: (len(self._on(model, w.worker_id)), w.worker_id)
                    ).worker_id
                if target is not None:
                    self._register(pool, program, target)

    # ---- helpers ----------------------------------------------------------------------------

    def _register(self, pool: _ModelPool, program: GatedProgram, worker_id: str) -> None:
        pool.paused.pop(program.key, None)
        program.worker_id, program.origin, program.paused = worker_id, None, False
        program.waiting_since = None
        self._changed.add(program.key)

    def _pause(self, pool: _ModelPool, program: GatedProgram) -> None:
        program.origin, program.worker_id, program.paused = program.worker_id, None, True
        program.paused_tokens = program.tokens
        pool.paused[program.key] = None
        self._changed.add(program.key)

    def _on(self, model: str, worker_id: str) -> list[GatedProgram]:
        pool = self._pools.get(model)
        return [] if pool is None else [p for p in pool.programs.values() if p.worker_id == worker_id]

    def _active_tokens(self, programs: Sequence[GatedProgram]) -> float:
        reasoning = sum(p.tokens for p in programs if p.reasoning)
        acting = sum(p.tokens for p in programs if not p.reasoning)
        return int(reasoning + self.config.acting_token_weight * acting)

    def _remaining_at(self, worker: WorkerView, now: float) -> float:
        return self.remaining(worker)

    def _decayed_remaining(self, worker: WorkerView, now: float) -> float:
        """``remaining_capacity_with_decay``: ACTING tokens x 2^(-t), unweighted; an ACTING program
        that never ended a call counts nothing."""
        capacity = _capacity(worker)
        assert capacity is not None
        programs = self._on(worker.model, worker.worker_id)
        acting = sum(
            p.tokens * 2.0 ** -(now - p.acting_since)
            for p in programs
            if not p.reasoning and p.acting_since is not None
        )
        used = int(sum(p.tokens for p in programs if p.reasoning) + acting)
        return capacity - used - len(programs) * self.config.buffer_per_program

    def _overflow(self, worker: WorkerView) -> float:
        overflow = -self.remaining(worker)
        if self.config.count_marked_as_released:
            overflow -= sum(p.tokens for p in self._on(worker.model, worker.worker_id) if p.marked)
        return overflow

    def _live(self, model: str) -> list[WorkerView]:
        assert self.scheduler is not None
        return [w for w in self.scheduler.workers() if w.model == model]

    def _healthy(self, model: str) -> list[WorkerView]:
        return [w for w in self._live(model) if not w.draining]

    def _pending(self) -> bool:
        """Whether the periodic check has work: a paused program, or a worker over capacity."""
        for model, pool in self._pools.items():
            if pool.paused or any(
                _capacity(w) is not None and self.remaining(w) < 0 for w in self._live(model)
            ):
                return True
        return False

    def _schedule_tick(self, now: float) -> None:
        if not self._pending():
            self._tick_at = None
        elif self._tick_at is None or self._tick_at <= now:
            self._tick_at = (math.floor(now / self.config.interval_s + _SLACK) + 1) * self.config.interval_s


# The routing policy registers its gate under the process table the scheduler binds it to; the
# priority policy, bound to the same table, finds it there.  Weak both ways: the gate holds the
# table, so a strong value would keep its own key alive.
_GATES: weakref.WeakKeyDictionary[ProcessTable, weakref.ref[ProgramGate]] = weakref.WeakKeyDictionary()


def _gate_of(table: ProcessTable | None) -> ProgramGate | None:
    ref = _GATES.get(table) if table is not None else None
    return ref() if ref is not None else None


@ROUTING_POLICIES.register("thunderagent")
class ThunderAgentRouting:
    """ThunderAgent's router: a call of an admitted program goes to the worker its program is
    registered on; a paused program's call waits (``None``) until the periodic check resumes it.

    Readings (docs/scheduling.md, "thunderagent"): a program is a (tenant, workflow_id) on one
    model, since each model has its own queue; a call without app_metadata belongs to no program
    and goes to the eligible worker with the fewest program tokens (ThunderAgent files such calls
    under one "default" program that nothing releases); a program whose worker is gone, draining or
    excluded for the call moves to that worker; a registered worker at its admission limit makes
    the call wait (the router would have queued it at the engine).
    """

    capabilities = frozenset(
        {
            Capability.PROGRAM_AWARE,
            Capability.SCHEDULER_AWARE,
            Capability.REBALANCES,
            Capability.WAKES,
            Capability.ENGINE_QUEUED,
        }
    )

    def __init__(self, config: ThunderAgentConfig | None = None) -> None:
        self.config = config or ThunderAgentConfig()
        self.gate = ProgramGate(ProcessTable(), self.config)  # replaced in bind_programs

    def bind_programs(self, table: ProcessTable) -> None:
        scheduler = self.gate.scheduler
        self.gate = ProgramGate(table, self.config)
        self.gate.scheduler = scheduler
        _GATES[table] = weakref.ref(self.gate)

    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        self.gate.scheduler = scheduler

    def engine_queue_factor(self) -> float:
        return self.config.engine_queue_factor

    def rebalance(self, now: float) -> None:
        self.gate.sync(now)

    def wake_at(self, now: float) -> float | None:
        return self.gate.wake_at(now)

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        program = self.gate.program(request.model, program_key(request))
        if program is not None and program.paused:
            return None
        if program is not None and program.worker_id is not None:
            pinned = next((w for w in workers if w.worker_id == program.worker_id), None)
            if (
                pinned is not None
                and pinned.model == request.model
                and not pinned.draining
                and pinned.worker_id not in request.exclude_workers
            ):
                return pinned.worker_id if pinned.has_room else None
        chosen = self.gate.least_tokens(eligible_workers(request, workers))
        if chosen is None:
            return None
        if program is not None:
            self.gate.rehome(program, chosen.worker_id)
        return chosen.worker_id


@PRIORITY_POLICIES.register("thunderagent")
class ThunderAgentPriority:
    """Admitted programs' calls (and calls of no program) first, at 1; paused programs' calls at 0.
    ThunderAgent forwards an admitted program's call at once, so none waits behind a paused one;
    within each class the order is arrival.  The value changes only when a program is admitted,
    paused, resumed or released, and the gate names those programs (``INCREMENTAL_PRIORITY``)."""

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def __init__(self) -> None:
        self._table: ProcessTable | None = None
        self._ranked = False

    def bind_programs(self, table: ProcessTable) -> None:
        self._table, self._ranked = table, False

    def priority(self, request: QueuedRequest, now: float) -> float:
        gate = _gate_of(self._table)
        return 0.0 if gate is not None and gate.is_paused(request) else 1.0

    def priority_changes(self, now: float) -> PriorityChanges:
        gate = _gate_of(self._table)
        if not self._ranked:
            self._ranked = True
            if gate is not None:
                gate.take_changed()
            return PriorityChanges(everything=True)
        return PriorityChanges(programs=gate.take_changed()) if gate is not None else PriorityChanges()


# Pythia ran ThunderAgent on SGLang with Mooncake as L3 (seeds/000 §7): HiCache, a static fleet.
PRESETS.register_preset("thunderagent", Preset("thunderagent", "thunderagent", cache="hicache"))
