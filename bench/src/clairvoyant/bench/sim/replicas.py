"""The simulated replicas: real ``LLMEngine`` instances over runners that say how long each step
takes, stepped in virtual time.

A replica steps whenever it has work: ``engine.step()`` runs at the step's start and its outputs
are delivered when the step's predicted time has elapsed.  With ``fast_forward``, a replica whose
next steps are plain decodes of an unchanging batch (``LLMEngine.plan_decode_run``) takes the whole
run in one event; ``cut`` ends such a run with the step in flight (where a new call would join the
batch step by step), and ``boundary_reports`` gives the KV usage the replica would have reported at
its last step boundary, so the results equal the step-by-step ones.  ``abort_waiting`` takes calls
that never started out of a replica's engine queue once its step in flight is delivered, and
``between_steps`` runs an action on an engine (a cache directive) where a live engine loop would:
now, or once the decode run in flight commits.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Protocol, runtime_checkable

import numpy as np

from clairvoyant.bench.records import KvTierTotals
from clairvoyant.bench.sim.events import EventQueue, Phase
from clairvoyant.scheduler.core import WorkerReport
from clairvoyant.worker.core.engine import DecodeRun, EngineConfig, LLMEngine, RequestOutput
from clairvoyant.worker.core.kv_transfer import KvPrefix, import_prefix
from clairvoyant.worker.core.l3 import L3Store
from clairvoyant.worker.core.tiers import InlineExecutor
from clairvoyant.worker.core.types import DecodeSpeed
from clairvoyant.worker.runners.base import ModelRunner

TENANT = "default"  # every simulated call's tenant, and so its KV's in the replicas' caches


@runtime_checkable
class SteppedRunner(ModelRunner, Protocol):
    """A runner that says how long its last ``forward`` took (in virtual seconds)."""

    last_step_seconds: float


@dataclass(frozen=True)
class ReplicaSpec:
    worker_id: str
    runner: SteppedRunner
    config: EngineConfig
    l3: L3Store | None = None  # the shared store (needs ``config.tiers.num_host_blocks``); one per run


class DecodeRunInFlight:
    """A decode run in flight on a replica: its plan, step end times and the steps to commit."""

    def __init__(self, plan: DecodeRun, start: float) -> None:
        self.plan = plan
        # Sequential sums, as one event per step would add them: bit-identical boundaries.
        self.start = start
        self.ends: list[float] = np.cumsum([start, *plan.step_seconds])[1:].tolist()
        self.commit_steps = plan.num_steps  # lowered when a new call cuts the run
        self.reported_steps = 0  # step boundaries whose KV usage the scheduler has seen


class Replica:
    def __init__(self, spec: ReplicaSpec, clock: Callable[[], float], *, kv_events: bool = False) -> None:
        """``kv_events``: the engine records ``KvEvent``s (``engine.drain_kv_events``), for a cache manager."""
        self.worker_id = spec.worker_id
        self.runner = spec.runner
        self.model = spec.runner.info.name
        # L3 jobs run inline (done at once, deterministic); the runner charges their modelled time.
        executor = InlineExecutor() if spec.l3 is not None else None
        self.engine = LLMEngine(
            spec.runner, spec.config, clock=clock, l3=spec.l3, executor=executor, kv_events=kv_events
        )
        self.busy = False
        self.run: DecodeRunInFlight | None = None
        self.imports: list[KvPrefix] = []  # arrived during a run: cached once its step in flight commits
        self.aborts: list[str] = []  # waiting calls to abort once the step in flight is delivered
        self.deferred: list[Callable[[], None]] = []  # engine actions waiting for the decode run to commit

    def report(self, kv_blocks_used: int | None = None) -> WorkerReport:
        stats = self.engine.stats()
        used = stats.kv_blocks_used if kv_blocks_used is None else kv_blocks_used
        speed = stats.decode_speed or DecodeSpeed(0.0, 0.0)
        return WorkerReport(
            worker_id=self.worker_id, model=self.model, address=f"sim://{self.worker_id}",
            max_batch=stats.max_num_seqs, running=stats.running, queued=stats.waiting,
            kv_blocks_used=used, kv_blocks_total=stats.kv_blocks_total,
            max_model_len=self.runner.info.max_model_len, preemptions_total=stats.preemptions_total,
            block_size=self.engine.config.block_size,
            decode_base_s=speed.base_s, decode_per_seq_s=speed.per_seq_s,
        )  # fmt: skip

    def tier_totals(self) -> KvTierTotals:
        """This replica's KV tier counters so far (L1 alone: every hit is an L1 hit)."""
        stats = self.engine.stats()
        return KvTierTotals(
            prompt_tokens=stats.prompt_tokens_total, hit_tokens=stats.hit_tokens,
            prefill_tokens_saved=stats.cached_prompt_tokens_total, demoted_blocks=stats.demoted_blocks_total,
            promoted_blocks=stats.promoted_blocks_total, l3_written_blocks=stats.l3_written_blocks_total,
            l3_fetched_blocks=stats.l3_fetched_blocks_total,
        )  # fmt: skip


class ReplicaStepper:
    """Steps each replica's engine in virtual time on ``events`` while it has work.

    ``started(request_id, time)``: the engine admitted the call to a step that began at ``time``
    (again after a preemption).  ``step_done(replica, outputs)``: a step, or a decode run, ended at
    ``events.now`` with these outputs; the replica steps again after it returns.
    """

    def __init__(
        self,
        replicas: Mapping[str, Replica],
        events: EventQueue,
        *,
        fast_forward: bool,
        started: Callable[[str, float], None],
        step_done: Callable[[Replica, list[RequestOutput]], None],
    ) -> None:
        self.replicas = replicas
        self.events = events
        self.fast_forward = fast_forward
        self._started = started
        self._step_done = step_done
        self._service: dict[str, float] = {}  # call id -> seconds it spent in a batch so far

    def take_service(self, request_id: str) -> float:
        """The seconds a finished call spent in a batch (its model execution time)."""
        return self._service.pop(request_id, 0.0)

    def wake(self, replica: Replica) -> None:
        """``replica`` may have work: it starts a step now unless one is under way."""
        if not replica.busy:
            replica.busy = True
            self.events.at(self.events.now, Phase.STEP_START, lambda: self._step(replica))

    def cut(self, replica: Replica, now: float) -> None:
        """A call joined ``replica``: a decode run in flight ends with the step in flight at ``now``."""
        run = replica.run
        if run is None:
            return
        steps = bisect.bisect_left(run.ends, now) + 1  # steps whose end is at or after now, first one
        if steps < run.commit_steps:
            run.commit_steps = steps
            self.events.at(run.ends[steps - 1], Phase.STEP_DONE, partial(self._run_done, replica, run, steps))

    def land(self, replica: Replica, prefix: KvPrefix, now: float) -> None:
        """A KV transfer to ``replica`` is done: the prefix joins its cache now or, mid-run, once the
        step in flight commits (step by step, that step has cached its blocks already)."""
        if replica.run is None:
            import_prefix(replica.engine.kv, replica.runner, prefix)
        else:
            self.cut(replica, now)
            replica.imports.append(prefix)

    def between_steps(self, replica: Replica, action: Callable[[], None]) -> None:
        """Run ``action`` on ``replica``'s engine between two steps: now, or, during a decode run
        (whose steps the engine has not taken yet), once the step in flight commits; then the
        replica steps if the action gave it work (a pre-prefill)."""
        if replica.run is None:
            action()
            self.wake(replica)
        else:
            self.cut(replica, self.events.now)
            replica.deferred.append(action)

    def abort_waiting(self, replica: Replica, request_ids: list[str]) -> None:
        """Abort calls WAITING in ``replica``'s engine (in no batch) as soon as its step in flight
        is delivered, or now when none is.  Waiting at the step's delivery, as they would have been
        step by step, so a decode run commits unchanged (``advance_decode`` refuses a batch with an
        abort pending) and the replica's reports and stats count them until then.  Their outputs
        (finish reason "abort") come with the next step."""
        replica.aborts += request_ids
        if not replica.busy:
            self._abort_pending(replica)
            self.wake(replica)

    def boundary_reports(self, now: float) -> Iterator[WorkerReport]:
        """For each replica mid-run, the report it would have sent at its last step boundary
        before ``now``, if the scheduler has not seen that one yet."""
        for replica in self.replicas.values():
            run = replica.run
            if run is None:
                continue
            done = min(bisect.bisect_right(run.ends, now), run.commit_steps)
            if done > run.reported_steps:
                run.reported_steps = done
                yield replica.report(kv_blocks_used=run.plan.kv_blocks_used_after(done))

    def _step(self, replica: Replica) -> None:
        if not replica.engine.has_unfinished():
            replica.busy = False
            return
        start = self.events.now
        plan = replica.engine.plan_decode_run() if self.fast_forward else None
        if plan is not None:
            run = replica.run = DecodeRunInFlight(plan, start)
            self.events.at(run.ends[-1], Phase.STEP_DONE, partial(self._run_done, replica, run, plan.num_steps))
            return
        outputs = replica.engine.step()
        for seq in replica.engine.last_schedule.admitted:
            if not seq.background:  # a pre-prefill is no call
                self._started(seq.request_id, start)
        duration = replica.runner.last_step_seconds
        for seq, _ in replica.engine.last_schedule.chunks:
            if not seq.background:
                self._service[seq.request_id] = self._service.get(seq.request_id, 0.0) + duration
        self.events.at(start + duration, Phase.STEP_DONE, lambda: self._delivered(replica, outputs))

    def _run_done(self, replica: Replica, run: DecodeRunInFlight, steps: int) -> None:
        if replica.run is not run or run.commit_steps != steps:
            return  # the run was cut: a later (earlier-ending) event commits it
        replica.run = None
        elapsed = run.ends[steps - 1] - run.start
        for seq in run.plan.seqs:
            self._service[seq.request_id] = self._service.get(seq.request_id, 0.0) + elapsed
        outputs = replica.engine.advance_decode(run.plan, steps)
        for prefix in replica.imports:
            import_prefix(replica.engine.kv, replica.runner, prefix)
        replica.imports.clear()
        for action in replica.deferred:
            action()
        replica.deferred.clear()
        self._delivered(replica, outputs)

    def _delivered(self, replica: Replica, outputs: list[RequestOutput]) -> None:
        self._abort_pending(replica)
        self._step_done(replica, outputs)
        replica.busy = False
        self.wake(replica)

    @staticmethod
    def _abort_pending(replica: Replica) -> None:
        for request_id in replica.aborts:
            replica.engine.abort_request(request_id)
        replica.aborts.clear()
