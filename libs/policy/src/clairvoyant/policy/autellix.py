"""Autellix (seeds/001, published as Agentix in that text): program-level attained service.

    call arrives ─> p(c) from the process table (PLAS Eq. 1 / ATLAS Eq. 2)
                 ─> Alg. 2 routes it at once to an engine (short: least used; long: the program's)
                 ─> the engine ranks it in K queues: start in Q_i with p(c) in [lo_i, hi_i),
                    demote after the queue's quantum, back to Q_1 when wait/service >= beta (Alg. 1)

The global half (priorities, routing) runs in the scheduler; the K-queue half runs on each engine
(``KQueueRule``), where calls wait and run.  Service is measured in seconds of model execution.
The seed's text gives no values for K, the queue boundaries, the quanta or beta; the defaults
below are ours and docs/scheduling.md says why.
"""

from __future__ import annotations

import bisect
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable, program_key
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    EngineSequence,
    LocalRule,
    PriorityChanges,
    ProgramRows,
    eligible_workers,
    least_used_eligible,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

SHORT_CALL_TOKENS = 2048  # Alg. 2 line 2 (footnote 3: from the traces' statistics)
ENGINE_QUEUE_FACTOR = 8.0  # placements per worker, x max_batch, before calls wait in the global queue


class _ProgramPolicy:
    """Holds the scheduler's process table (the ProgramAware hook)."""

    programs: ProcessTable

    def __init__(self) -> None:
        self.programs = ProcessTable()  # replaced by the scheduler's own in bind_programs

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table


class _ProgramPriority(_ProgramPolicy):
    """A priority that reads only the call and its program's entry (``IncrementalPriority``): a
    completion re-keys one program's queued calls, not the whole queue."""

    def __init__(self) -> None:
        super().__init__()
        self._rows = ProgramRows()

    def priority_changes(self, now: float) -> PriorityChanges:
        return self._rows.changes(self.programs)


@PRIORITY_POLICIES.register("plas")
class PlasPriority(_ProgramPriority):
    """PLAS, §4.2.1 Eq. 1: priority = -(total service of the program's completed calls).

    Read as: service is the model execution time each completion reports (Alg. 1 line 4), summed
    over every completed call of the program, whatever its thread; a call outside any program (no
    app_metadata) has attained nothing and ranks first.  The value is evaluated when the call is
    placed, which with engine-side queueing is its arrival (Alg. 1 line 11).
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def priority(self, request: QueuedRequest, now: float) -> float:
        program = self.programs.of(request)
        return 0.0 if program is None else -program.service_s


@PRIORITY_POLICIES.register("atlas")
class AtlasPriority(_ProgramPriority):
    """ATLAS, §4.2.1 Eq. 2: priority = -p(c), p(c) = max over parents of p(parent) + t(parent).

    Read as: parents are the call's app_metadata.parent_request_ids that completed in the same
    program; without any (no ids given, or none known), p(c) is the program's scalar, the longest
    critical path observed so far (Alg. 1 lines 4 and 11, the paper's own implementation), which
    is 0 for a program's first call.  p(c) is fixed when the call arrives.  On a chain both
    readings equal PLAS.
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def priority(self, request: QueuedRequest, now: float) -> float:
        return -self.programs.atlas_priority(request)


@dataclass(frozen=True)
class KQueueConfig:
    """The discretisation of §4.2.2.  K = len(boundaries) + 1 queues.

    boundaries: Q_i^lo for i = 2..K in seconds of attained service (Q_1^lo = 0, Q_K^hi = inf).
    quanta: the time quantum of Q_1..Q_{K-1} in seconds of model execution; None = each queue's
      width (hi - lo), so a call demotes after the service that would carry its program across
      the queue.  Q_K has no quantum.
    beta: promote a call to Q_1 when (W_p + W_c) / (T_p + T_c) >= beta; inf turns it off.
    """

    boundaries: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    quanta: tuple[float, ...] | None = None
    beta: float = 4.0

    def __post_init__(self) -> None:
        if any(b <= 0 for b in self.boundaries) or list(self.boundaries) != sorted(set(self.boundaries)):
            raise ValueError("boundaries must be positive and strictly increasing")
        if self.quanta is not None and (
            len(self.quanta) != len(self.boundaries) or any(q <= 0 for q in self.quanta)
        ):
            raise ValueError("quanta: one positive value per queue but the last")
        if self.beta <= 0:
            raise ValueError("beta must be positive")

    @property
    def num_queues(self) -> int:
        return len(self.boundaries) + 1

    def queue_of(self, attained: float) -> int:
        """The 0-based queue whose range holds ``attained`` (Alg. 1 line 12)."""
        return bisect.bisect_right(self.boundaries, attained)

    def quantum(self, queue: int) -> float:
        if queue >= len(self.boundaries):
            return math.inf
        if self.quanta is not None:
            return self.quanta[queue]
        lo = self.boundaries[queue - 1] if queue else 0.0
        return self.boundaries[queue] - lo


@dataclass
class _CallState:
    queue: int
    quantum_left: float
    seen: float  # engine time of the last update
    tokens: int  # output tokens at that time: more later means it ran in between
    wait_s: float = 0.0  # W_c since arrival or the last promotion
    model_s: float = 0.0  # T_c since arrival or the last promotion


@dataclass
class KQueueRule:
    """Alg. 1 lines 15-31 on one engine: queue, quantum, demotion and beta promotion per call.

    Effective priority = -(queue index); the engine breaks ties by earlier arrival, which is the
    FCFS order inside a queue (read: by the call's arrival, not by when it entered the queue).
    The initial queue comes from the base priority: -(queue index) from ``KQueuePriority``.

    Readings: time between two steps counts as model time for a call whose output grew (it was
    in the batch) and as waiting otherwise, so a call mid chunked prefill counts as waiting;
    demotion resets the quantum to the new queue's (line 22); promotion puts the call in Q_1 and
    zeroes only its own W_c and T_c (line 29).  W_p and T_p are the program's completed calls'
    waiting and service time when the call was placed, which the placement carries to the engine
    (``program_wait_s``, ``program_service_s``), live and simulated alike.
    """

    config: KQueueConfig
    _calls: weakref.WeakKeyDictionary[EngineSequence, _CallState] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False
    )

    def effective_priority(self, seq: EngineSequence, now: float) -> float:
        state = self._calls.get(seq)
        if state is None:
            queue = min(max(0, round(-seq.priority)), self.config.num_queues - 1)
            state = self._calls[seq] = _CallState(
                queue, self.config.quantum(queue), now, seq.num_output_tokens
            )
        elif now > state.seen:
            self._advance(seq, state, now)
        return float(-state.queue)

    def queue_of(self, seq: EngineSequence) -> int | None:
        """Diagnostics: the queue a sequence is in, None if never ranked."""
        state = self._calls.get(seq)
        return None if state is None else state.queue

    def _advance(self, seq: EngineSequence, state: _CallState, now: float) -> None:
        elapsed = now - state.seen
        if seq.num_output_tokens > state.tokens:
            state.model_s += elapsed
            state.quantum_left -= elapsed
        else:
            state.wait_s += elapsed
        state.seen, state.tokens = now, seq.num_output_tokens
        while state.quantum_left <= 0 and state.queue < self.config.num_queues - 1:  # lines 20-23
            state.queue += 1
            state.quantum_left = self.config.quantum(state.queue)
        if state.queue > 0 and self._starving(seq, state):  # lines 24-30
            state.queue, state.quantum_left = 0, self.config.quantum(0)
            state.wait_s = state.model_s = 0.0

    def _starving(self, seq: EngineSequence, state: _CallState) -> bool:
        if math.isinf(self.config.beta):
            return False
        wait = state.wait_s + seq.program_wait_s
        service = state.model_s + seq.program_service_s
        if wait <= 0:
            return False
        return service <= 0 or wait / service >= self.config.beta


@PRIORITY_POLICIES.register("autellix-kq")
class KQueuePriority(AtlasPriority):
    """Autellix's scheduler (§4.2.2, Alg. 1): ATLAS's p(c) discretised into K queues.

    Priority = -(index of the queue whose range holds p(c)), so the global queue and an engine
    without the rule still rank by queue; the engine-side ``KQueueRule`` adds quanta, demotion
    and beta.  With ``atlas=False`` every call enters Q_1: the program-agnostic MLFQ of Fig. 2c.
    """

    capabilities = frozenset(
        {
            Capability.PROGRAM_AWARE,
            Capability.FIXED_PRIORITY,
            Capability.INCREMENTAL_PRIORITY,
            Capability.ENGINE_RULE,
        }
    )

    def __init__(self, config: KQueueConfig | None = None, *, atlas: bool = True) -> None:
        super().__init__()
        self.config = config or KQueueConfig()
        self.atlas = atlas

    def priority(self, request: QueuedRequest, now: float) -> float:
        if not self.atlas:
            return 0.0
        return -float(self.config.queue_of(self.programs.atlas_priority(request)))

    def priority_is_fixed(self) -> bool:
        """Without ATLAS every call is in Q_1 (``FixedPriority``: the queue is a heap from submit)."""
        return not self.atlas

    def engine_rule(self) -> LocalRule:
        return KQueueRule(self.config)


@ROUTING_POLICIES.register("least-used")
class LeastUsedRouting:
    """Every call at once to the engine with the fewest outstanding calls (§6.4's "Least Used").

    Calls queue at the engine (up to ENGINE_QUEUE_FACTOR x max_batch placements per worker), so
    the engine's priorities and preemption decide who runs, as in Autellix where the load
    balancer holds nothing back.
    """

    capabilities = frozenset({Capability.ENGINE_QUEUED})

    def __init__(self, engine_queue_factor: float = ENGINE_QUEUE_FACTOR) -> None:
        self._factor = engine_queue_factor

    def engine_queue_factor(self) -> float:
        return self._factor

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        # Alg. 2 LEAST_USED over the eligible: fewest outstanding calls, then KV usage, then id.
        best = least_used_eligible(request, workers)
        return best.worker_id if best is not None else None


@ROUTING_POLICIES.register("autellix-lb")
class LocalityLoadBalancer(LeastUsedRouting, _ProgramPolicy):
    """Autellix's load balancer, §4.3 Alg. 2: calls of at most 2,048 prompt tokens go to the least
    used engine; longer ones to their program's engine, pinned by its first long call.

    Readings: "tokens" are the call's prompt tokens; the pin is the process table's engine_id,
    the one column this policy writes; a pinned engine that is full waits ("justifying occasional
    queuing delays"), one that is gone, draining or excluded for the call is replaced by the least
    used engine, which becomes the new pin.  A call outside any program is never pinned.
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.ENGINE_QUEUED})

    def __init__(self, engine_queue_factor: float = ENGINE_QUEUE_FACTOR) -> None:
        LeastUsedRouting.__init__(self, engine_queue_factor)
        _ProgramPolicy.__init__(self)

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        if request.prompt_tokens <= SHORT_CALL_TOKENS:
            best = least_used_eligible(request, workers)
            return best.worker_id if best is not None else None
        program = self.programs.get(program_key(request))
        if program is not None and program.engine_id is not None:
            pinned = next((w for w in workers if w.worker_id == program.engine_id), None)
            if pinned is not None and eligible_workers(request, [pinned]):
                return program.engine_id
            if (
                pinned is not None
                and pinned.model == request.model
                and not pinned.draining
                and pinned.worker_id not in request.exclude_workers
            ):
                return None  # pinned engine full: wait for it
        best = least_used_eligible(request, workers)
        if best is None:
            return None
        chosen = best.worker_id
        if program is not None:
            program.engine_id = chosen
        return chosen


def _kq_mlfq() -> KQueuePriority:
    return KQueuePriority(KQueueConfig(beta=math.inf), atlas=False)


PRIORITY_POLICIES.register("mlfq")(_kq_mlfq)
PRESETS.register_preset("plas", Preset("plas", "autellix-lb"))
PRESETS.register_preset("atlas", Preset("atlas", "autellix-lb"))
PRESETS.register_preset("mlfq", Preset("mlfq", "least-used"))
PRESETS.register_preset("autellix", Preset("autellix-kq", "autellix-lb"))
