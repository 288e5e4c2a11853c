"""The simulator: workflows -> global scheduler -> replica engines, in virtual time.

    arrival ──> roots ready ──submit──> GlobalScheduler ──dispatch──> replica LLMEngine.add_request
                   ^                                                        │ step (cost-model time)
                   └── dependents ready after the tool latency <── finished ┘

The replicas step on their own (replicas.py); the scheduler sees a replica's state after every
step, as if heartbeats were instant.  A placement naming a ``kv_source`` may wait for a KV move
(kv_migration.py).  With a cache policy, one cache manager core for the run hears the replicas'
KV events and loads and the calls' completion records, and its directives act on the replicas
(cache_manager.py).  Deterministic: the same inputs give the same records, byte for byte, with or
without ``fast_forward``.  docs/benchmarks.md ("How the simulator runs") tells the whole design.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import NamedTuple, Protocol

import torch

from clairvoyant.bench.records import CallResult, KvTierTotals, RunRecords
from clairvoyant.bench.sim.cache_manager import (
    DEFAULT_DELAYS,
    CacheManagerDelays,
    SimCacheManager,
    completed_call,
)
from clairvoyant.bench.sim.events import EventQueue, Phase
from clairvoyant.bench.sim.kv_migration import KvMigrations, Migration
from clairvoyant.bench.sim.lower_bound import ServiceTime, lower_bound
from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.bench.sim.recorder import RunRecorder
from clairvoyant.bench.sim.replicas import TENANT, Replica, ReplicaSpec, ReplicaStepper, SteppedRunner
from clairvoyant.bench.sim.workflows import WorkflowProgress
from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.policy.cache import CachePolicy, CompletedCall
from clairvoyant.scheduler.core import Decision, GlobalScheduler, QueuedRequest
from clairvoyant.worker.core.engine import EngineRequest, RequestOutput
from clairvoyant.worker.core.kv_transfer import KvPrefix
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.sequence import Sequence as EngineSequence
from clairvoyant.worker.core.sequence import SequenceStatus
from clairvoyant.worker.core.types import Lineage
from clairvoyant.workloads.program import Call, WorkflowProgram

# ReplicaSpec, SteppedRunner, Migration, TENANT and CacheManagerDelays belong to its interface too.
__all__ = [
    "PROGRESS_EVERY_S",
    "CacheManagerDelays",
    "TENANT",
    "Annotator",
    "Migration",
    "ReplicaSpec",
    "SimProgress",
    "Simulator",
    "SteppedRunner",
    "Ticker",
]

PROGRESS_EVERY_S = 10.0  # virtual seconds between progress calls (``Simulator.run(progress=...)``)


class SimProgress(NamedTuple):
    """Where a run stands: its virtual clock and how many of its workflows have ended."""

    virtual_s: float
    workflows_done: int
    workflows_total: int


class Annotator(Protocol):
    """What the simulator asks of an annotator (annotations.py has the profiler's and the oracle)."""

    @property
    def needs_completions(self) -> bool:
        """True: ``observe`` gets each call's completion record (its token ids and block-hash
        chains, which cost time to hash); False: it gets None."""
        ...

    def annotate(self, program: WorkflowProgram, call: Call, now: float) -> SysAnnotations | None:
        """The annotations of ``call``, which became ready at ``now`` (None: unannotated)."""
        ...

    def observe(
        self, program: WorkflowProgram, record: CallResult, last: bool, completion: CompletedCall | None = None
    ) -> None:
        """``record`` finished (served or rejected; ``end_time`` set); ``last``: no call of its
        workflow is left unfinished; ``completion``: its completion record, as the cache manager
        gets it, when ``needs_completions`` (else None)."""
        ...


class Ticker(Protocol):
    """Something that acts every so often in virtual time, between events (the autoscaler,
    autoscaling.py).  ``Simulator.attach`` hands it the run; the run then stops when no event is
    left and every workflow has ended, so a ticker never prolongs a run."""

    @property
    def next_tick(self) -> float:
        """When it acts next: after every event due at or before then."""
        ...

    def tick(self) -> None:
        """Act at ``events.now`` (= ``next_tick``); then ``next_tick`` is later."""
        ...


IDLE_TICKS_LIMIT = 10_000  # ticks with no event left and workflows unfinished before a run gives up


class Simulator:
    """One run: one scheduling preset, a list of (arrival time, program), and replicas that are
    fixed unless a ``Ticker`` (the autoscaler) adds and removes them."""

    def __init__(
        self,
        replicas: Sequence[ReplicaSpec],
        preset: str,
        *,
        seed: int = 0,
        service_times: Mapping[str, ServiceTime] | None = None,
        fast_forward: bool = True,
        scheduler: GlobalScheduler | None = None,
        annotator: Annotator | None = None,
        migrate_kv: bool = True,
        cache_policy: str | CachePolicy | None = None,
        record_completions: bool = False,
        cachemgr_delays: CacheManagerDelays = DEFAULT_DELAYS,
        model_group: str | None = None,
    ) -> None:
        """``service_times``: each model's batch-1 service time, for the lower bound (none: 0).
        ``fast_forward``: take decode runs in one event (the results are the same).
        ``scheduler``: a scheduler built by the caller (policies with non-default parameters)
        instead of ``preset``'s; it must have no workers yet.
        ``annotator``: gives each call its annotations (none: every call is unannotated).
        ``migrate_kv``: move a session's KV where ``Decision.kv_source`` says (kv_migration.py);
        off: such calls recompute.  ``migrations`` lists the moves made.
        ``cache_policy``: a registered cache policy's name (or a policy object): the run gets a
        cache manager (``cache_manager``; ``RunRecords.cache_manager`` says what it did), its
        messages delayed by ``cachemgr_delays``.  None: no cache manager, the engines evict LRU on their own.
        ``record_completions``: ``completions`` lists every call's ``CompletedCall``, in order
        of ending (refused calls too, not ``ok``).
        ``model_group``: a model group of the scheduler's (a ``ModelAssigning`` routing policy's):
        every call that may run on more than one model (``Call.alternative_models``) is submitted
        naming the group, with its workflow's input text (``WorkflowProgram.input``), and its record's
        ``model`` becomes the model of the replica it is placed on."""
        self.service_times = dict(service_times or {})
        self.model_group = model_group
        self._wakes: set[float] = set()  # times a dispatch is due for the scheduler's ``wake_at``
        self.migrate_kv = migrate_kv
        self.fast_forward = fast_forward
        self.annotator = annotator
        self.events = EventQueue()
        self._kv_events = cache_policy is not None
        self.replicas = {spec.worker_id: self._replica(spec) for spec in replicas}
        self.scheduler = scheduler or GlobalScheduler.from_preset(preset, max_queue_per_model=1_000_000)
        for replica in self.replicas.values():
            replica.engine.scheduler.rule = self.scheduler.engine_rule()
        self.prompts = PromptBook(seed)
        self._moves = KvMigrations(self.replicas, self.prompts)
        self.migrations: list[Migration] = self._moves.made
        self._recorder = RunRecorder()
        self.records = self._recorder.records
        self._calls = self._recorder.calls
        self._stepper = ReplicaStepper(
            self.replicas,
            self.events,
            fast_forward=fast_forward,
            started=self._recorder.started,
            step_done=self._step_done,
        )
        self._progress = WorkflowProgress()
        self._outputs: dict[str, list[int]] = {}
        self._backlog: list[WorkflowProgram] = []  # closed loop: programs still to start
        self._workflows_total = 0  # arrivals and backlog of the run
        self._workflows_done = 0
        self._think_time_s = 0.0
        self._submitted = False  # a call joined the global queue since depths were last recorded
        self._tickers: list[Ticker] = []
        self._removed_preemptions = 0  # of replicas that have left the run
        self._removed_tiers = KvTierTotals()  # their KV tier counters
        self.record_completions = record_completions
        self.completions: list[CompletedCall] = []
        self._annotator_completions = annotator is not None and annotator.needs_completions
        self._served_with: dict[str, SysAnnotations | None] = {}  # call id -> its annotations (for completions)
        self.cache_manager: SimCacheManager | None = None
        if cache_policy is not None:
            self.cache_manager = SimCacheManager(
                cache_policy, self.replicas, self.events, self._stepper, delays=cachemgr_delays
            )
            self.attach(self.cache_manager)
        for replica in self.replicas.values():
            self.scheduler.update_worker(replica.report(), 0.0)
            if self.cache_manager is not None:
                self.cache_manager.joined(replica)

    def _replica(self, spec: ReplicaSpec) -> Replica:
        return Replica(spec, lambda: self.events.now, kv_events=self._kv_events)

    # ---- driving -------------------------------------------------------------------------------

    def run(
        self,
        arrivals: Sequence[tuple[float, WorkflowProgram]],
        *,
        backlog: Sequence[WorkflowProgram] = (),
        think_time_s: float = 0.0,
        until: float | None = None,
        progress: Callable[[SimProgress], None] | None = None,
    ) -> RunRecords:
        """Run to completion.  Closed loop: each workflow that ends starts the next one of
        ``backlog`` after ``think_time_s`` (``arrivals`` are the initial ones).

        ``until``: stop once virtual time passes it (a partial run, e.g. to time the simulator
        itself; ``resume`` goes on); the records then hold unfinished workflows and calls too.
        ``progress``: called every ``PROGRESS_EVERY_S`` virtual seconds, the last time at the end."""
        self._backlog = list(reversed(backlog))
        self._think_time_s = think_time_s
        self._workflows_total += len(arrivals) + len(backlog)
        for time, program in arrivals:
            self.events.at(time, Phase.READY, partial(self._arrive, program))
        return self.resume(until, progress)

    def resume(self, until: float | None = None, progress: Callable[[SimProgress], None] | None = None) -> RunRecords:
        """Go on with a run that ``run(..., until=...)`` stopped: to completion, or to ``until``."""
        self.advance(until, progress)
        preemptions = sum(r.engine.stats().preemptions_total for r in self.replicas.values())
        preemptions += self._removed_preemptions
        records = self._recorder.assemble(self.events.now, preemptions, partial=until is not None)
        records.kv_tiers = sum((r.tier_totals() for r in self.replicas.values()), self._removed_tiers)
        if self.cache_manager is not None:
            if until is None:
                self.cache_manager.finish()
            records.cache_manager = self.cache_manager.totals()
        return records

    def progress(self) -> SimProgress:
        return SimProgress(self.events.now, self._workflows_done, self._workflows_total)

    def advance(self, until: float | None = None, progress: Callable[[SimProgress], None] | None = None) -> None:
        """Process events to completion (or to ``until``) without assembling the records: the
        simulation proper, which ``resume`` follows with a pass over every record.

        With ``progress``, the events go in slices of ``PROGRESS_EVERY_S`` virtual seconds, each
        followed by a call: the same events in the same order as in one go."""
        # The runner's and sampler's tensors are small (rows x a 260-token vocabulary): a second
        # intra-op thread never pays for itself, and on a busy machine each op past torch's
        # parallel grain (~128 rows) waits ~1-2 ms for a descheduled thread.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        # The cyclic garbage collector's passes over the millions of long-lived radix nodes and
        # records took ~40% of a saturated run, and the event loop makes no reference cycles
        # (gc.collect() after 30 virtual seconds of 256 coding_assistant workflows finds none):
        # reference counting frees everything, so the collector is paused for the run.
        collecting = gc.isenabled()
        gc.disable()
        end = float("inf") if until is None else until
        try:
            if self._tickers:
                self._advance_ticking(end, progress)
            elif progress is None:
                self.events.run(end)
            else:
                while (due := self.events.next_time()) is not None and due <= end:
                    self.events.run(min(end, due + PROGRESS_EVERY_S))
                    progress(self.progress())  # after the last slice: where the run ends
        finally:
            torch.set_num_threads(threads)
            if collecting:
                gc.enable()

    def _advance_ticking(self, end: float, progress: Callable[[SimProgress], None] | None) -> None:
        """The events up to each tick, then the tick, until nothing is left to happen.

        A tick comes after every event due at or before it; of tickers due at once, the one
        attached first ticks first.  The run ends at its last event (not at a tick after it), so
        a ticker that changes nothing leaves every record as without it."""
        reported = 0.0
        idle_ticks = 0
        while True:
            ticker = min(self._tickers, key=lambda t: t.next_tick)  # the first of equals
            due = ticker.next_tick
            if due > end:
                break
            upcoming = self.events.next_time()
            if upcoming is not None and upcoming <= due:
                self.events.run(upcoming)  # one instant at a time: its events may bring a tick forward
                continue
            if upcoming is None and self._workflows_done == self._workflows_total:
                break
            self.events.now = due  # every event left is later
            ticker.tick()
            idle_ticks = idle_ticks + 1 if self.events.next_time() is None else 0
            if idle_ticks > IDLE_TICKS_LIMIT:
                break  # nothing will ever run again (assemble reports the unfinished workflows)
            if progress is not None and due - reported >= PROGRESS_EVERY_S:
                reported = due
                progress(self.progress())
        if end != float("inf"):
            self.events.run(end)
        if progress is not None:
            progress(self.progress())

    # ---- replicas joining and leaving (the autoscaler's hooks) ---------------------------------

    def attach(self, ticker: Ticker) -> None:
        """Have ``ticker`` act between events from now on, besides those attached before."""
        self._tickers.append(ticker)

    def add_replica(self, spec: ReplicaSpec) -> Replica:
        """A replica joins now: the scheduler hears of it and may place calls on it at once."""
        if spec.worker_id in self.replicas:
            raise ValueError(f"replica {spec.worker_id!r} is already in the run")
        replica = self.replicas[spec.worker_id] = self._replica(spec)
        replica.engine.scheduler.rule = self.scheduler.engine_rule()
        self.scheduler.update_worker(replica.report(), self.events.now)
        if self.cache_manager is not None:
            self.cache_manager.joined(replica)
        self._dispatch()
        return replica

    def hand_back_waiting(self, worker_ids: Iterable[str]) -> list[str]:
        """The calls these (drained) replicas hold that have not started go back to the global
        queue and are placed again now; returns their ids.

        Not started: WAITING in the replica's engine and never admitted to a batch (a preempted
        call keeps its place: it has run).  Each one is aborted in that engine (``abort_waiting``),
        its placement released unserved, and submitted again as the same call: same id and
        annotations, queued since it became ready, excluding the replica that handed it back.  A
        live worker that drains ends such a call with UNAVAILABLE and the gateway places it again
        in the same way.  Its record's worker and dispatch time become those of the new placement.
        Only for a model the scheduler expects (``expect_models``, as the autoscaler sets): its
        calls may always wait in the global queue for a replica."""
        now = self.events.now
        expected = self.scheduler.expected_models()
        handed: list[str] = []
        for worker_id in worker_ids:
            replica = self.replicas[worker_id]
            if replica.model not in expected:
                continue
            unstarted = {seq.request_id for seq in replica.engine.scheduler.waiting if _never_started(seq)}
            requests = [r for r in self.scheduler.placed_requests(worker_id) if r.request_id in unstarted]
            if not requests:
                continue
            self._stepper.abort_waiting(replica, [r.request_id for r in requests])
            for request in requests:
                self.scheduler.complete(request.request_id)  # no ``now``: abandoned, no service counted
                record = self._calls[request.request_id]
                record.worker_id, record.dispatch_time = "", None
                del self._outputs[request.request_id]
                again = dataclasses.replace(request, exclude_workers=request.exclude_workers | {worker_id})
                self.scheduler.submit(again, now)
                handed.append(request.request_id)
        if handed:
            self._submitted = True
            self._dispatch()
        return handed

    def replica_idle(self, worker_id: str) -> bool:
        """Whether ``worker_id`` holds no call, runs no step and has no work in its engine (a cache
        manager's pre-prefill, which no placement counts, included)."""
        replica = self.replicas[worker_id]
        return not (
            self.scheduler.placed_requests(worker_id) or replica.engine.has_unfinished() or replica.run is not None
        )

    def remove_replica(self, worker_id: str) -> None:
        """An idle replica leaves now (the scheduler removes its worker).  Raises ValueError when
        it still holds a call or work: a replica is released only once drained (``replica_idle``)."""
        replica = self.replicas[worker_id]
        if not self.replica_idle(worker_id):
            held = self.scheduler.placed_requests(worker_id)
            raise ValueError(
                f"replica {worker_id!r} is not idle ({len(held)} calls placed on it, "
                f"engine work left: {replica.engine.has_unfinished()}, step in flight: {replica.run is not None})"
            )
        del self.replicas[worker_id]
        self._removed_preemptions += replica.engine.stats().preemptions_total
        self._removed_tiers += replica.tier_totals()
        self.scheduler.remove_worker(worker_id)
        if self.cache_manager is not None:
            self.cache_manager.left(worker_id)

    # ---- workflows and the global scheduler ----------------------------------------------------

    def _arrive(self, program: WorkflowProgram) -> None:
        now = self.events.now
        roots = self._progress.start(program, now)
        bound = lower_bound(program, self.service_times) if self.service_times else 0.0
        self._recorder.workflow_arrived(program, now, bound)
        for call in roots:
            self._ready(program, call)
        self._dispatch()

    def _ready(self, program: WorkflowProgram, call: Call) -> None:
        now = self.events.now
        self._recorder.call_ready(program, call, now)
        meta = AppMetadata(
            program.workflow_type, program.workflow_id, call.agent_id, parent_request_ids=call.dependencies
        )
        group = self.model_group if call.alternative_models else None
        grouped = group is not None
        request = QueuedRequest(
            request_id=call.call_id, tenant=TENANT, model=group if group is not None else call.model,
            arrival_time=now, prompt_tokens=call.prompt_tokens, max_tokens=call.output_tokens, app_metadata=meta,
            annotations=None if self.annotator is None else self.annotator.annotate(program, call, now),
            input_text=program.input.text if grouped and program.input is not None else "",
        )  # fmt: skip
        if self._builds_completions():
            self._served_with[call.call_id] = request.annotations
        self.scheduler.submit(request, now)
        self._submitted = True

    def _ready_and_dispatch(self, program: WorkflowProgram, call: Call) -> None:
        self._ready(program, call)
        self._dispatch()

    def _dispatch(self) -> None:
        now = self.events.now
        for report in self._stepper.boundary_reports(now):  # what replicas mid-run last reported
            self.scheduler.update_worker(report, now)
        decisions = self.scheduler.dispatch(now)
        for decision in decisions:
            record = self._calls[decision.request_id]
            replica = self.replicas[decision.worker_id]
            record.worker_id, record.dispatch_time = replica.worker_id, now
            record.model = replica.model  # a model group's call: the model chosen for it
            program = self._progress.programs[record.workflow_id]
            migration = self._moves.plan(decision, program, now) if self.migrate_kv else None
            if migration is None:
                self._start(replica, record, decision)
            else:
                prefix, end = migration
                start = partial(self._migrated, replica, record, decision, prefix)
                self.events.at(end, Phase.READY, start)
        if decisions or self._submitted:  # nothing else changes a queue's depth
            self._submitted = False
            self._recorder.queue_depths(now, self.scheduler.queue_depths())
        wake = self.scheduler.wake_at(now)
        if wake is not None and wake > now and wake not in self._wakes:
            self._wakes.add(wake)
            self.events.at(wake, Phase.READY, partial(self._woken, wake))

    def _woken(self, wake: float) -> None:
        self._wakes.discard(wake)
        self._dispatch()

    # ---- calls on the replicas -----------------------------------------------------------------

    def _start(self, replica: Replica, record: CallResult, decision: Decision) -> None:
        """Hand a placed call to its replica's engine (or record the replica's refusal)."""
        program = self._progress.programs[record.workflow_id]
        call = program.call(record.call_id)
        now = self.events.now
        try:
            self._add_request(replica, program, call, decision)
        except (ValueError, InvalidRequest) as exc:  # what a live worker answers with INVALID_ARGUMENT
            self._reject(record, str(exc), now)
            return
        self._outputs[call.call_id] = []
        self._stepper.cut(replica, now)
        self._stepper.wake(replica)

    def _migrated(self, replica: Replica, record: CallResult, decision: Decision, prefix: KvPrefix) -> None:
        """The transfer is done: the prefix joins the replica's cache (unless its pool is full
        then: the call recomputes), and the call starts."""
        self._stepper.land(replica, prefix, self.events.now)
        self._start(replica, record, decision)

    def _add_request(self, replica: Replica, program: WorkflowProgram, call: Call, decision: Decision) -> None:
        """The call as a live worker gets it: the placement's priority and its program's attainment."""
        replica.engine.add_request(
            EngineRequest(
                request_id=call.call_id,
                prompt_token_ids=self.prompts.prompt(program.workflow_type, call),
                sampling=SamplingParams(max_tokens=call.output_tokens, temperature=0.0, ignore_eos=True),
                priority=decision.base_priority,
                lineage=Lineage(TENANT, program.workflow_id, call.agent_id, call.call_id),
                detokenize=False,
                program_wait_s=decision.program_wait_s,
                program_service_s=decision.program_service_s,
                seat_limit=decision.seat_limit,
            )
        )

    def _reject(self, record: CallResult, reason: str, now: float) -> None:
        """A call the replica refused: it ends at once with no output and its workflow goes on, as an
        agent that gets an error and carries on would (without the tool call a reply would have led
        to).  Reports count it under ``rejected_calls``, apart from the served ``calls``."""
        record.rejected, record.end_time = reason, now
        self.scheduler.complete(record.call_id)
        self.prompts.record_response(record.call_id, [])  # later prompts that quote it get nothing
        self._observe(record, self._completed(record, []))
        self._release_dependents(self._progress.programs[record.workflow_id], record, now)  # no output: no tool

    def _step_done(self, replica: Replica, outputs: list[RequestOutput]) -> None:
        if self.replicas.get(replica.worker_id) is not replica:
            return  # it left the run with only handed-back calls' aborts in flight: nothing to tell
        now = self.events.now
        finished: list[RequestOutput] = []
        for out in outputs:
            if out.finish_reason == "abort":
                continue  # handed back (``hand_back_waiting``): the call goes on elsewhere
            record = self._calls[out.request_id]
            self._outputs[out.request_id] += out.new_token_ids
            if out.new_token_ids and record.first_token_time is None:
                record.first_token_time = now
            if out.finished:
                finished.append(out)
        for out in finished:
            self._finish(out, now)
        if self.cache_manager is not None:
            self.cache_manager.stepped(replica)
        self.scheduler.update_worker(replica.report(), now)
        self._dispatch()

    def _finish(self, out: RequestOutput, now: float) -> None:
        record = self._calls[out.request_id]
        record.end_time, record.cached_tokens = now, out.cached_tokens
        record.generated_tokens = out.completion_tokens
        service = self._stepper.take_service(out.request_id)
        self.scheduler.complete(out.request_id, now=now, service_s=service, output_tokens=out.completion_tokens)
        output = self._outputs.pop(out.request_id)
        self.prompts.record_response(out.request_id, output)
        self._observe(record, self._completed(record, output))
        self._release_dependents(self._progress.programs[record.workflow_id], record, now + record.tool_latency_s)

    def _builds_completions(self) -> bool:
        """Does anything take completion records?  (Hashing the chains costs time.)"""
        return self.record_completions or self.cache_manager is not None or self._annotator_completions

    def _completed(self, record: CallResult, output: list[int]) -> CompletedCall | None:
        """The call's completion record, for the cache manager, ``completions`` and an annotator
        that needs it; None when nothing takes it."""
        if not self._builds_completions():
            return None
        replica = self.replicas.get(record.worker_id)
        call = completed_call(
            record, self._progress.programs[record.workflow_id], prompt_ids=self.prompts.prompt_of(record.call_id),
            output_ids=output, annotations=self._served_with.pop(record.call_id, None),
            block_size=replica.engine.config.block_size if replica is not None else 16, tenant=TENANT,
            last=self._progress.is_last_call(record.workflow_id),
        )  # fmt: skip
        if self.record_completions:
            self.completions.append(call)
        if self.cache_manager is not None:
            self.cache_manager.completed(call)
        return call

    def _observe(self, record: CallResult, completion: CompletedCall | None) -> None:
        if self.annotator is not None:
            last = self._progress.is_last_call(record.workflow_id)
            program = self._progress.programs[record.workflow_id]
            self.annotator.observe(program, record, last, completion if self._annotator_completions else None)

    def _release_dependents(self, program: WorkflowProgram, record: CallResult, done_at: float) -> None:
        ready, end = self._progress.call_done(program, record.call_id, done_at)
        for child in ready:
            self.events.at(done_at, Phase.READY, partial(self._ready_and_dispatch, program, child))
        if end is None:
            return
        self._recorder.workflows[program.workflow_id].end_time = end
        self._workflows_done += 1
        if self._backlog:
            following = self._backlog.pop()
            self.events.at(end + self._think_time_s, Phase.READY, lambda: self._arrive(following))
        self.prompts.forget([c.call_id for c in program.calls])
        self.scheduler.end_workflow(TENANT, program.workflow_id)


def _never_started(seq: EngineSequence) -> bool:
    """Waiting for its first admission: no token computed, none generated, never preempted."""
    return (
        seq.status is SequenceStatus.WAITING
        and seq.cached_tokens is None
        and seq.num_computed_tokens == 0
        and seq.num_output_tokens == 0
        and seq.num_preemptions == 0
    )
