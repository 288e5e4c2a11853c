"""Clairvoyant's own preset: Pythia's lookahead, with what the other seeds do better.

    submit ──> ClairvoyantPriority, fixed at submit                ──> ClairvoyantRouting
               ω × S_completion (Pythia Alg. 3, first term)              Kairos §6 time-slot fit
               − aging × the program's start (Kairos §5.2 order,         (memory: no call placed where
                 Autellix-style bounded waiting)                          its KV growth would overflow)
                                                                         + SAGA §5.1 session affinity
    engine ──> PythiaAgingRule (Pythia §4.2.2)                            under load 0.8
                                                                         held at each worker's knee
                                                                         (admission.py, φ 0.7)

Each part, and what it replaces, is chosen by a measurement in docs/scheduling.md ("clairvoyant"):

- Priority.  Pythia's completion score S = 1 / (1 + E[remaining steps]) ranks calls of workflows
  near their end first.  Inside equal scores, the program that started first goes first (Kairos
  §5.2; Continuum's program-level FCFS): a program that has started keeps its KV warm and
  finishes, instead of all programs advancing in lock-step and evicting each other.  Both terms
  are one number, ω × S − aging × start, because ``p + aging × (now − start)`` orders requests
  exactly as ``p − aging × start`` does (the ``aging × now`` term is common to all): so the
  aging that bounds every request's wait is free, and the priority changes only when the
  program's entry in the process table does (``IncrementalPriority``: the queue stays a heap and
  only the programs an update touched are re-keyed).  A request
  of a program started at t0 is overtaken only by requests of programs started before
  t0 + ω / aging (S ≤ 1), so its wait is bounded by the work of those programs.  The aging rate
  (0.0001 per second) is ours, chosen by measurement (docs/scheduling.md).
- Pythia's second term (downstream idle risk) is left out: it depends on live queue depths, so it
  would make every decision re-rank the queue, and its measured effect is within noise
  (docs/scheduling.md).
- Routing.  Kairos' time-slot packing decides whether a call fits (it tracks each call's
  expected KV growth over 0.5 s slots, where Pythia's Alg. 2 reserves every call's p99 bound for
  its whole life and, with ε, caps the calls per node); among the workers it fits, the call's
  session worker wins while its expected peak stays under 0.8 of its KV (SAGA §5.1's load
  threshold), else the lowest expected peak (Kairos §6).
- Passing over.  A call that fits no worker does not hold back the calls behind it that do: up
  to 16 such calls are passed over while the head has waited under 30 s (``Backfill``), measured
  in docs/scheduling.md ("Passing over a call that does not fit").
- Admission.  Each worker holds placements only up to the knee of its decode throughput
  (``KneeAdmission``, φ = 0.7), so the priority decides who runs and the calls it puts first
  decode at a batch's efficient size; measured better than no limit (docs/scheduling.md).
  ``clairvoyant-unbounded`` leaves it out.
- Unannotated requests (no profile yet, or an untrusted one) get S = 0 and keep the start order,
  so before the profiler converges the preset is program-level FCFS with memory-aware placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.policy.admission import KneeAdmission
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.kairos import KairosTimeSlotRouting, TimeSlotConfig
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable
from clairvoyant.policy.pythia import PythiaAgingRule, completion_score, trusted_annotations
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    Backfill,
    LocalRule,
    PriorityChanges,
    ProgramRows,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

# Priority per program opened before: 10^6 programs weigh as much as 10 ms of start at the default
# aging, and a double still resolves it next to aging × start for a clock of up to about a year.
RANK_TIE_BREAK = 1e-12


@dataclass(frozen=True, slots=True)
class ClairvoyantPriorityConfig:
    completion_weight: float = 1.0  # ω: weight of Pythia's S_completion (in (0, 1])
    # Priority per second of program age: S = 1 weighs as much as a program 10,000 s older (measured
    # against 0.01 and 0.001 in docs/scheduling.md).
    aging_rate: float = 0.0001
    engine_aging_rate: float = 0.01  # the engine's aging (PythiaAgingRule), per second there

    def __post_init__(self) -> None:
        if self.completion_weight < 0 or self.aging_rate <= 0 or self.engine_aging_rate < 0:
            raise ValueError("completion_weight >= 0, aging_rate > 0 and engine_aging_rate >= 0")


@PRIORITY_POLICIES.register("clairvoyant")
class ClairvoyantPriority:
    """ω × S_completion − aging × program start; see the module docstring.

    S_completion is Pythia's (``pythia.completion_score``) from trusted annotations, 0 otherwise.
    The program start is the process table's ``Program.first_arrival`` (the scheduler records the
    call in the table before it ranks it); a call of no program starts its own.  A program that
    left the table (idle for its TTL in a long tool call) starts again with its next call.
    """

    capabilities = frozenset(
        {Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY, Capability.ENGINE_RULE}
    )

    def __init__(self, config: ClairvoyantPriorityConfig | None = None) -> None:
        self.config = config or ClairvoyantPriorityConfig()
        self.programs: ProcessTable | None = None
        self._rows = ProgramRows()

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table

    def program_order(self, request: QueuedRequest) -> float:
        """The aging term: aging × the program's start, plus ``RANK_TIE_BREAK`` × the order its entry
        was opened in, so that programs started at the same instant (a cron batch) still keep one
        order across all their calls instead of advancing in lock-step."""
        program = self.programs.of(request) if self.programs is not None else None
        if program is None:
            return self.config.aging_rate * request.arrival_time
        start = min(program.first_arrival, request.arrival_time)
        return self.config.aging_rate * start + RANK_TIE_BREAK * program.rank

    def priority(self, request: QueuedRequest, now: float) -> float:
        score = completion_score(trusted_annotations(request))
        return self.config.completion_weight * score - self.program_order(request)

    def priority_changes(self, now: float) -> PriorityChanges:
        """The value reads only the call and its program's entry (``IncrementalPriority``)."""
        return self._rows.changes(self.programs)

    def engine_rule(self) -> LocalRule:
        return PythiaAgingRule(self.config.engine_aging_rate)


def gittins_score(annotations: SysAnnotations | None, time_scale_s: float) -> float:
    """1 / (1 + R_G / τ) in [0, 1): R_G = 1 / G is the remaining work the Gittins index G of the
    workflow's remaining-work distribution stands for (a deterministic job of that size has index
    G), τ = ``time_scale_s``; 0 without an index."""
    if annotations is None or not annotations.remaining_gittins_index:
        return 0.0
    return 1.0 / (1.0 + 1.0 / (annotations.remaining_gittins_index * time_scale_s))


@PRIORITY_POLICIES.register("clairvoyant-gittins")
class ClairvoyantGittinsPriority(ClairvoyantPriority):
    """``clairvoyant`` with the workflow's Gittins rank in place of Pythia's completion score.

    The profiler's remaining-work model (services/profiler/.../core/remaining.py) gives each call
    the Gittins index G of its workflow's remaining work given its progress; the score is
    ``gittins_score`` with τ = ``gittins_time_scale_s`` (10 s, about one agent call: a workflow
    whose remaining work ranks like one call's scores 1/2, as Pythia's S does for one step left).
    The aging term and everything else are ``clairvoyant``'s.  Measured against it in
    docs/profiler.md ("Ranking and JCT in the simulator").
    """

    gittins_time_scale_s = 10.0

    def priority(self, request: QueuedRequest, now: float) -> float:
        score = gittins_score(trusted_annotations(request), self.gittins_time_scale_s)
        return self.config.completion_weight * score - self.program_order(request)


@dataclass(frozen=True, slots=True)
class ClairvoyantRoutingConfig:
    slots: TimeSlotConfig = TimeSlotConfig()
    affinity_load: float = 0.8  # SAGA §5.1: stay on the session's worker below this expected peak / KV
    # Calls that do not fit may be passed over (``Backfill``): program-start order puts the oldest
    # programs' long contexts at the head, and without it one that does not fit holds back every
    # call that would (measured in docs/scheduling.md, "Passing over a call that does not fit").
    backfill: Backfill = Backfill()

    def __post_init__(self) -> None:
        if not 0.0 < self.affinity_load <= 1.0:
            raise ValueError("affinity_load must be in (0, 1]")


@ROUTING_POLICIES.register("clairvoyant")
class ClairvoyantRouting(KairosTimeSlotRouting):
    """Kairos' time-slot fit (§6) with SAGA's session affinity (§5.1) as the first choice.

    Among the eligible, unsuspended workers the call fits (``KairosTimeSlotRouting.fit``): the
    session's worker (``Program.engine_id``) when its expected peak with the call is below
    ``affinity_load`` × its KV capacity; otherwise the lowest expected peak, then the smaller id.
    The chosen worker becomes the session's worker.  None fits: the call waits, and dispatch may
    pass over it to calls that fit (``backfill``, up to 16 calls while the head has waited under
    30 s).
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.OBSERVES_WORKERS, Capability.BACKFILLS})

    def __init__(self, config: ClairvoyantRoutingConfig | None = None) -> None:
        self.routing_config = config or ClairvoyantRoutingConfig()
        super().__init__(self.routing_config.slots)

    def backfill(self) -> Backfill:
        return self.routing_config.backfill

    def prefers(self, request: QueuedRequest, worker: WorkerView, peak: float) -> bool:
        """The session's worker, while its expected peak stays under the affinity load."""
        program = self.programs.of(request) if self.programs is not None else None
        return (
            program is not None
            and worker.worker_id == program.engine_id
            and peak < self.routing_config.affinity_load * self.capacity(worker)
        )

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        chosen = super().route(request, workers, now)
        program = self.programs.of(request) if self.programs is not None else None
        if chosen is not None and program is not None:
            program.engine_id = chosen
        return chosen


@ROUTING_POLICIES.register("clairvoyant-knee")
class ClairvoyantKneeRouting(KneeAdmission, ClairvoyantRouting):
    """``clairvoyant`` routing that holds each worker at its knee (``admission.py``)."""

    capabilities = ClairvoyantRouting.capabilities | {Capability.ADMITS}


# ``clairvoyant`` admits at the knee (φ 0.7, no displacement): measured on bursts of 256 workflows,
# 0.98x / 0.92x the avg JCT of the same preset without it at no cost in throughput or P95
# (docs/scheduling.md, "Admission at the knee").  ``clairvoyant-unbounded`` is that preset without
# the knee, for the ablation.
PRESETS.register_preset("clairvoyant", Preset("clairvoyant", "clairvoyant-knee", cache="pythia"))
PRESETS.register_preset("clairvoyant-unbounded", Preset("clairvoyant", "clairvoyant", cache="pythia"))
PRESETS.register_preset("clairvoyant-gittins", Preset("clairvoyant-gittins", "clairvoyant", cache="pythia"))
