"""Kairos (seeds/004, §5-6): agent-level priority and memory-aware time-slot dispatch.

    call arrives ─> priority: the agent's rank (§5.1, from the profiler), then the earlier
                    workflow start inside a rank (§5.2)
                 ─> dispatch: for each instance, add the call's linear KV growth (Eq. 1-2) to the
                    0.5 s slots of the calls already placed there (Eq. 3); an instance fits when
                    no slot the call spans exceeds its capacity; the fitting instance with the
                    lowest expected peak wins; none fits: the call waits (§6 steps 1-2)
                 ─> an instance that runs out of memory gets no new call for a while (§6, last
                    paragraph)

The rank itself (Wasserstein distances + 1-D MDS with a zero anchor) is computed by the profiler
(profiler/core/ranking.py) and reaches the scheduler as ``SysAnnotations.kairos_rank``: 0 is the
agent with the least remaining latency, the one to run first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable, ProgramKey, program_key
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    PriorityChanges,
    ProgramRows,
    eligible_workers,
)
from clairvoyant.policy.types import QueuedRequest, WorkerReport, WorkerView

# One rank step outweighs any difference in workflow start: starts are core-time seconds, and a
# live scheduler's monotonic clock stays below 1e9 s (31 years).  At rank 100 the float still
# resolves 2e-5 s of start time.
RANK_SPAN_S = 1e9


class _StartTimes:
    """The start time of each program: the arrival of its first call, the process table's
    ``Program.first_arrival`` (it outlives the calls' completions and goes with the entry).

    A call outside any program, or whose entry is gone (not bound to a table, or the program
    ended while the call waits), is its own workflow: its own arrival.  The value reads only the
    call and its program's entry (``changes``: the programs an update touched).
    """

    def __init__(self) -> None:
        self.programs: ProcessTable | None = None
        self._rows = ProgramRows()

    def start_of(self, request: QueuedRequest) -> float:
        program = self.programs.get(program_key(request)) if self.programs is not None else None
        return request.arrival_time if program is None else min(program.first_arrival, request.arrival_time)

    def changes(self) -> PriorityChanges:
        return self._rows.changes(self.programs)


@PRIORITY_POLICIES.register("kairos")
class KairosPriority:
    """Kairos's workflow-aware priority (§5): agent rank first, then earlier workflow start.

    priority = -((rank + 1) * RANK_SPAN_S + workflow start), so a lower rank always wins and,
    inside a rank, the program that started first (§5.2: the application-level start time, which
    captures the latency a program accumulated in earlier stages).

    Readings:
    - The rank is the profiler's ``kairos_rank`` (§5.1), an integer >= 0 per agent of a workflow
      type.  The paper ranks all agents of co-located applications on one axis; ranks of different
      workflow types are compared here as they come, so rank 0 of one type ties with rank 0 of
      another and the earlier start decides.
    - A request without a rank (no annotations, or a profile that has not converged) falls back to
      FCFS: priority 0, so the scheduler orders such requests by arrival.  0 is above every ranked
      priority, so unranked requests go first: the profiler has no evidence that their remaining
      latency is long, and putting them last could starve a workflow type without a profile.
    - "Workflow start" is the arrival of the program's first call (the scheduler never sees the
      frontend arrival of §5.2); a call outside any program is its own workflow.
    - "Inside an agent" is read as inside a rank: two agents with the same rank share the order.
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def __init__(self) -> None:
        self._starts = _StartTimes()

    def bind_programs(self, table: ProcessTable) -> None:
        self._starts.programs = table

    def priority(self, request: QueuedRequest, now: float) -> float:
        annotations = request.annotations
        if annotations is None or annotations.kairos_rank is None:
            return 0.0
        rank = max(0.0, annotations.kairos_rank)
        return -((rank + 1.0) * RANK_SPAN_S + self._starts.start_of(request))

    def priority_changes(self, now: float) -> PriorityChanges:
        """The rank is the call's; the start, its program's entry (``IncrementalPriority``)."""
        return self._starts.changes()


@dataclass(frozen=True)
class TimeSlotConfig:
    """Parameters of the time-slot dispatcher (§6).

    slot_s: slot length; the paper's empirical choice is 0.5 s (§6 step 1).
    decode_tokens_per_s: v_r of Eq. 1, the KV growth of one decoding call, which the paper takes
      from hardware profiling; ours is a single estimate for every instance.
    block_size: tokens per KV block, to turn a worker's kv_blocks_total into tokens when the worker
      reports no block size (the engine's default is 16).
    default_output_tokens: the output length assumed when a call has neither a prediction nor
      max_tokens.
    suspend_s: how long an instance gets no new call after it reported preemptions.
    """

    slot_s: float = 0.5
    decode_tokens_per_s: float = 50.0
    block_size: int = 16
    default_output_tokens: int = 256
    suspend_s: float = 0.5

    def __post_init__(self) -> None:
        if self.slot_s <= 0 or self.decode_tokens_per_s <= 0 or self.suspend_s < 0:
            raise ValueError("slot_s and decode_tokens_per_s must be positive, suspend_s >= 0")
        if self.block_size < 1 or self.default_output_tokens < 0:
            raise ValueError("block_size must be >= 1 and default_output_tokens >= 0")


@dataclass(frozen=True, slots=True)
class Booking:
    """One placed call's expected KV footprint (Eq. 1): prompt_tokens at ``start``, growing by
    decode_tokens_per_s up to prompt_tokens + output_tokens at ``end`` (Eq. 2: end = start plus
    the expected execution time)."""

    request_id: str
    program: ProgramKey | None
    start: float
    end: float
    prompt_tokens: int
    output_tokens: int

    def tokens_at(self, t: float, rate: float) -> float:
        return self.prompt_tokens + min(float(self.output_tokens), rate * max(0.0, t - self.start))


class SlotPlan:
    """One instance's expected memory over the slots from ``now`` on (Eq. 3 on a slot grid).

        slot k covers [k*slot_s, (k+1)*slot_s); slots are counted from the one holding ``now``
        |--- now ---|-----------|-----------|
          slot c      slot c+1    slot c+2      usage(slot) = sum over bookings alive in it
                                                of their tokens at the slot's end (its peak)

    A booking is alive in a slot that starts before its end.  One still running after its
    expected end (slower than predicted) counts at its final size in the current slot only.
    """

    def __init__(self, bookings: Sequence[Booking], now: float, config: TimeSlotConfig) -> None:
        self.config = config
        self.now = now
        self.first_slot = math.floor(now / config.slot_s)
        self.bookings = list(bookings)

    def _slot_end(self, index: int) -> float:
        return (self.first_slot + index + 1) * self.config.slot_s

    def span(self, booking: Booking) -> int:
        """Slots (from the current one) the booking is alive in; at least the current one."""
        end = max(booking.end, self.now)
        return max(1, math.ceil(end / self.config.slot_s) - self.first_slot)

    def usage(self, extra: Booking | None = None) -> list[float]:
        """Expected tokens per slot, with ``extra`` added, up to the last slot anyone is alive in."""
        bookings = [*self.bookings, *([extra] if extra is not None else [])]
        spans = [self.span(b) for b in bookings]
        slots = [0.0] * max(spans, default=1)
        rate = self.config.decode_tokens_per_s
        for booking, span in zip(bookings, spans, strict=True):
            for index in range(span):
                slots[index] += booking.tokens_at(
                    min(self._slot_end(index), max(booking.end, self.now)), rate
                )
        return slots


@ROUTING_POLICIES.register("kairos-timeslot")
class KairosTimeSlotRouting:
    """Kairos's memory-aware time-slot dispatcher (§6).

    For each eligible instance: its bookings (the calls this policy placed there that have not
    completed) plus the new call, per 0.5 s slot.  The instance is available when none of the
    slots the new call spans exceeds its capacity (kv_blocks_total x block_size tokens); among
    the available ones, the lowest expected peak over all future slots wins, then the smaller
    worker id.  None available: the call waits (the scheduler stops there, keeping priority order).

    Readings:
    - Memory is counted in tokens.  A call holds its prompt from dispatch (no prefix-cache
      sharing) and grows by decode_tokens_per_s up to prompt + predicted output (Eq. 1).
    - Predicted output = the profiler's ``predicted_output_len.p50`` (the paper takes the mode of
      the agent's latency distribution for the expected execution time, Eq. 2; the p50 of the
      output length is the closest we get), else max_tokens, else default_output_tokens.
      Expected execution time = predicted output / decode_tokens_per_s.
    - Completion ("removes its memory usage", §6): a call leaves the bookings when its program's
      entry in the process table no longer lists it as active; calls outside any program, and
      any excess over the worker's placed count, leave earliest expected end first.
    - A worker that reports no KV pool (kv_blocks_total = 0) has unlimited capacity.
    - A call larger than an empty instance could never fit: it goes to an instance with no
      bookings (lowest id), or waits for one, so it cannot wait forever.
    - OOM (§6): an instance is suspended while its last report shows a full pool with calls
      waiting for it (kv_blocks_used >= kv_blocks_total and queued > 0), and for suspend_s after
      ``report_preemptions`` saw its preemption count grow.  Suspension applies only while the
      policy has calls placed there, so an idle instance always takes work.
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.OBSERVES_WORKERS})

    def __init__(self, config: TimeSlotConfig | None = None) -> None:
        self.config = config or TimeSlotConfig()
        self.programs: ProcessTable | None = None
        self._bookings: dict[str, list[Booking]] = {}  # worker id -> calls placed there
        self._preemptions: dict[str, int] = {}  # worker id -> last reported preemptions_total
        self._suspended_until: dict[str, float] = {}

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table

    # ---- what a caller may report ---------------------------------------------------------------

    def observe_worker(self, report: WorkerReport, now: float) -> None:
        """Every heartbeat (``WorkerObserver``): its preemption count feeds the OOM suspension."""
        self.report_preemptions(report.worker_id, report.preemptions_total, now)

    def report_preemptions(self, worker_id: str, preemptions_total: int, now: float) -> bool:
        """The worker's cumulative preemption count (WorkerStats.preemptions_total).  A rise means
        calls ran out of memory there: no new call for suspend_s.  Returns True when it suspended."""
        previous = self._preemptions.get(worker_id)
        self._preemptions[worker_id] = preemptions_total
        if previous is not None and preemptions_total > previous:
            self._suspended_until[worker_id] = now + self.config.suspend_s
            return True
        return False

    # ---- decisions --------------------------------------------------------------------------------

    def expected_output_tokens(self, request: QueuedRequest) -> int:
        annotations = request.annotations
        if annotations is not None and annotations.predicted_output_len is not None:
            return max(0, round(annotations.predicted_output_len.p50))
        return request.max_tokens if request.max_tokens > 0 else self.config.default_output_tokens

    def booking_for(self, request: QueuedRequest, now: float) -> Booking:
        output = self.expected_output_tokens(request)
        end = now + output / self.config.decode_tokens_per_s
        return Booking(request.request_id, program_key(request), now, end, request.prompt_tokens, output)

    def suspended(self, worker: WorkerView, now: float) -> bool:
        if worker.placed == 0:
            return False
        if now < self._suspended_until.get(worker.worker_id, -math.inf):
            return True
        full = worker.kv_blocks_total > 0 and worker.kv_blocks_used >= worker.kv_blocks_total
        return full and worker.queued > 0

    def fit(self, worker: WorkerView, booking: Booking, now: float) -> tuple[bool, float]:
        """(available, expected peak in tokens) of ``booking`` added to ``worker``."""
        bookings = self.bookings(worker)
        plan = SlotPlan(bookings, now, self.config)
        slots = plan.usage(booking)
        peak = max(slots)
        if worker.kv_blocks_total <= 0:
            return True, peak
        capacity = self.capacity(worker)
        spanned = slots[: plan.span(booking)]
        alone = booking.prompt_tokens + booking.output_tokens > capacity
        return (not bookings if alone else max(spanned) <= capacity), peak

    def capacity(self, worker: WorkerView) -> float:
        """KV capacity in tokens (infinite when the worker reports no pool)."""
        if worker.kv_blocks_total <= 0:
            return math.inf
        return float(worker.kv_blocks_total * (worker.block_size or self.config.block_size))

    def prefers(self, request: QueuedRequest, worker: WorkerView, peak: float) -> bool:
        """Whether ``worker`` goes before every worker it does not prefer, whatever their peaks.
        Kairos prefers none; a subclass may (clairvoyant's session affinity)."""
        return False

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        self._forget_missing(workers)
        booking = self.booking_for(request, now)
        best: tuple[bool, float, str] | None = None  # (not preferred, peak, id): smallest wins
        for worker in eligible_workers(request, workers):
            self._reconcile(worker)
            if self.suspended(worker, now):
                continue
            available, peak = self.fit(worker, booking, now)
            if not available:
                continue
            key = (not self.prefers(request, worker, peak), peak, worker.worker_id)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        self._bookings.setdefault(best[2], []).append(booking)
        return best[2]

    def bookings(self, worker: WorkerView) -> list[Booking]:
        return list(self._bookings.get(worker.worker_id, ()))

    # ---- bookkeeping -------------------------------------------------------------------------------

    def _reconcile(self, worker: WorkerView) -> None:
        """Drop the bookings of calls that completed (§6: a faster call frees its slots at once)."""
        booked = self._bookings.get(worker.worker_id)
        if not booked:
            return
        if self.programs is not None:
            booked = [b for b in booked if self._still_active(b)]
        if len(booked) > worker.placed:
            booked = sorted(booked, key=lambda b: (b.end, b.start, b.request_id))[
                len(booked) - worker.placed :
            ]
        self._bookings[worker.worker_id] = booked

    def _still_active(self, booking: Booking) -> bool:
        if booking.program is None or self.programs is None:
            return True  # only the placed count can tell
        program = self.programs.get(booking.program)
        return program is not None and booking.request_id in program.active

    def _forget_missing(self, workers: Sequence[WorkerView]) -> None:
        live = {w.worker_id for w in workers}
        for worker_id in [w for w in self._bookings if w not in live]:
            del self._bookings[worker_id]
            self._suspended_until.pop(worker_id, None)


PRESETS.register_preset("kairos", Preset("kairos", "kairos-timeslot"))
