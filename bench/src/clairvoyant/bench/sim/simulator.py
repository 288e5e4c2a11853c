"""The simulator: workflows -> global scheduler -> replica engines, in virtual time.

    arrival ──> roots ready ──submit──> GlobalScheduler ──dispatch──> replica LLMEngine.add_request
                   ^                                                        │ step (cost-model time)
                   └── dependents ready after the tool latency <── finished ┘

Each replica steps whenever it has work: ``engine.step()`` runs at the step's start and its
outputs are delivered when the step's predicted time has elapsed.  The scheduler sees a replica's
state after every step, as if heartbeats were instant.

Decode runs (``fast_forward``, on by default): when a replica's next steps are plain decodes of an
unchanging batch (``LLMEngine.plan_decode_run``), the simulator schedules one event at the end of
the whole run instead of one per step.  A call dispatched to the replica meanwhile cuts the run at
the end of the step in flight, exactly where step-by-step it would join the batch; and before
every dispatch the scheduler gets the KV usage the replica would have reported at its last step
boundary.  Results equal the step-by-step ones (a test runs both), at a fraction of the work.

Program-level policies learn what a live scheduler would: each completion carries the call's model
execution time (the steps it was in a batch), a workflow's end closes its process-table entry, and
a preset with an engine-side rule (Autellix's K queues) gets one rule per replica, which reads what
a live worker's rule reads: the call's placement (its priority and its program's attainment).  With an ``annotator`` (annotations.py), each call is submitted with the
annotations it returns when the call becomes ready, and learns of each call that finishes.

KV migration (``migrate_kv``, on by default): a placement whose ``Decision.kv_source`` names another
replica (SAGA's stolen sessions) exports from it, at once, the cached prefix of the call's prompt
(the live worker's ExportKV by tokens; the live scheduler, which has no tokens, exports the
session's path instead), and the call joins its new replica only when the transfer is done: after
``EmulatesKvTransfer.kv_transfer_seconds(exported tokens)`` (the cost model's inter-node link), when
the prefix is imported into the new replica's radix cache.  Whether to wait for it is the
scheduler core's rule (``scheduler.core.migration.worth_moving``), with the recompute time of one
batch-1 prefill of what the move would save (``recompute_seconds``).  Neither replica stalls
meanwhile (the NICs move the KV), and the source keeps its copy.  ``migrations`` lists the
transfers made.  Exports and plans only peek at the caches, and an import that lands during a
decode run waits for the step in flight to commit (the run is cut there), so fast-forwarded runs
still equal step-by-step ones.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from clairvoyant.bench.records import CallResult, RunRecords, WorkflowRecord
from clairvoyant.bench.sim.events import EventQueue, Phase
from clairvoyant.bench.sim.lower_bound import ServiceTime, lower_bound
from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.scheduler.core import Decision, GlobalScheduler, QueuedRequest, WorkerReport
from clairvoyant.scheduler.core.migration import worth_moving
from clairvoyant.worker.core.engine import DecodeRun, EngineConfig, EngineRequest, LLMEngine, RequestOutput
from clairvoyant.worker.core.kv_transfer import KvPrefix, export_prefix, import_prefix
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.base import EmulatesKvTransfer, ModelRunner
from clairvoyant.workloads.program import Call, WorkflowProgram

if TYPE_CHECKING:
    from clairvoyant.bench.sim.annotations import Annotator

TENANT = "default"
PROGRESS_EVERY_S = 10.0  # virtual seconds between progress calls (``Simulator.run(progress=...)``)


class SimProgress(NamedTuple):
    """Where a run stands: its virtual clock and how many of its workflows have ended."""

    virtual_s: float
    workflows_done: int
    workflows_total: int


@runtime_checkable
class SteppedRunner(ModelRunner, Protocol):
    """A runner that says how long its last ``forward`` took (in virtual seconds)."""

    last_step_seconds: float


class Migration(NamedTuple):
    """A KV transfer the simulator made for a placement (``Decision.kv_source``)."""

    call_id: str  # the call that waited for it
    source: str  # replica the session's KV was exported from
    target: str  # replica it was imported into, where the call runs
    tokens: int  # exported (and charged) tokens: the whole blocks of the prompt the source caches
    saved_tokens: int  # of which the call's prompt would have recomputed on the target
    start: float  # virtual time of the placement
    end: float  # start + the transfer's modelled seconds: the call joins the target then


@dataclass(frozen=True)
class ReplicaSpec:
    worker_id: str
    runner: SteppedRunner
    config: EngineConfig


class _Run:
    """A decode run in flight on a replica: its plan, step end times and the steps to commit."""

    def __init__(self, plan: DecodeRun, start: float) -> None:
        self.plan = plan
        # Sequential sums, as one event per step would add them: bit-identical boundaries.
        self.start = start
        self.ends: list[float] = np.cumsum([start, *plan.step_seconds])[1:].tolist()
        self.commit_steps = plan.num_steps  # lowered when a new call cuts the run
        self.reported_steps = 0  # step boundaries whose KV usage the scheduler has seen


class _Replica:
    def __init__(self, spec: ReplicaSpec, clock: Callable[[], float]) -> None:
        self.worker_id = spec.worker_id
        self.runner = spec.runner
        self.model = spec.runner.info.name
        self.engine = LLMEngine(spec.runner, spec.config, clock=clock)
        self.busy = False
        self.run: _Run | None = None
        self.imports: list[KvPrefix] = []  # arrived during a run: cached once its step in flight commits

    def report(self, kv_blocks_used: int | None = None) -> WorkerReport:
        stats = self.engine.stats()
        used = stats.kv_blocks_used if kv_blocks_used is None else kv_blocks_used
        return WorkerReport(
            worker_id=self.worker_id, model=self.model, address=f"sim://{self.worker_id}",
            max_batch=stats.max_num_seqs, running=stats.running, queued=stats.waiting,
            kv_blocks_used=used, kv_blocks_total=stats.kv_blocks_total,
            max_model_len=self.runner.info.max_model_len, preemptions_total=stats.preemptions_total,
            block_size=self.engine.config.block_size,
        )  # fmt: skip


class Simulator:
    """One run: fixed replicas, one scheduling preset, a list of (arrival time, program)."""

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
    ) -> None:
        """``service_times``: each model's batch-1 service time, for the lower bound (none: 0).
        ``fast_forward``: take decode runs in one event (the results are the same).
        ``scheduler``: a scheduler built by the caller (policies with non-default parameters)
        instead of ``preset``'s; it must have no workers yet.
        ``annotator``: gives each call its annotations (none: every call is unannotated).
        ``migrate_kv``: move a session's KV where ``Decision.kv_source`` says (the module's rule);
        off: such calls recompute."""
        self.service_times = dict(service_times or {})
        self.migrate_kv = migrate_kv
        self.migrations: list[Migration] = []
        self.fast_forward = fast_forward
        self.annotator = annotator
        self.events = EventQueue()
        self.replicas = {spec.worker_id: _Replica(spec, lambda: self.events.now) for spec in replicas}
        self.scheduler = scheduler or GlobalScheduler.from_preset(preset, max_queue_per_model=1_000_000)
        for replica in self.replicas.values():
            replica.engine.scheduler.rule = self.scheduler.engine_rule()
        self.prompts = PromptBook(seed)
        self.records = RunRecords()
        self._calls: dict[str, CallResult] = {}
        self._programs: dict[str, WorkflowProgram] = {}
        self._workflows: dict[str, WorkflowRecord] = {}
        self._waiting_on: dict[str, int] = {}  # call id -> unfinished dependencies
        self._outputs: dict[str, list[int]] = {}
        self._service: dict[str, float] = {}  # call id -> seconds it spent in a batch so far
        self._children: dict[str, dict[str, tuple[str, ...]]] = {}  # workflow -> call -> dependents
        self._remaining: dict[str, int] = {}  # workflow -> calls not finished
        self._latest: dict[str, float] = {}  # workflow -> latest call end (tool included)
        self._backlog: list[WorkflowProgram] = []  # closed loop: programs still to start
        self._workflows_total = 0  # arrivals and backlog of the run
        self._workflows_done = 0
        self._think_time_s = 0.0
        self._depths: dict[str, int] = {}  # model -> global queue depth last recorded
        self._submitted = False  # a call joined the global queue since depths were last recorded
        for replica in self.replicas.values():
            self.scheduler.update_worker(replica.report(), 0.0)

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
        return self._finish_records(until)

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
            if progress is None:
                self.events.run(end)
            else:
                while (due := self.events.next_time()) is not None and due <= end:
                    self.events.run(min(end, due + PROGRESS_EVERY_S))
                    progress(self.progress())  # after the last slice: where the run ends
        finally:
            torch.set_num_threads(threads)
            if collecting:
                gc.enable()

    def _finish_records(self, until: float | None) -> RunRecords:
        unfinished = [w.workflow_id for w in self._workflows.values() if w.end_time is None]
        if unfinished and until is None:
            raise RuntimeError(f"{len(unfinished)} workflows never finished (e.g. {unfinished[0]})")
        self.records.workflows = sorted(self._workflows.values(), key=lambda w: (w.arrival_time, w.workflow_id))
        self.records.calls = sorted(self._calls.values(), key=lambda c: (c.ready_time, c.call_id))
        self.records.preemptions = sum(r.engine.stats().preemptions_total for r in self.replicas.values())
        first = min((w.arrival_time for w in self.records.workflows), default=0.0)
        self.records.duration_s = self.events.now - first
        return self.records

    def _arrive(self, program: WorkflowProgram) -> None:
        now = self.events.now
        self._programs[program.workflow_id] = program
        self._children[program.workflow_id] = program.dependents()
        self._remaining[program.workflow_id] = len(program.calls)
        self._latest[program.workflow_id] = now
        bound = lower_bound(program, self.service_times) if self.service_times else 0.0
        self._workflows[program.workflow_id] = WorkflowRecord(
            program.workflow_id, program.workflow_type, now, len(program.calls), lower_bound_s=bound
        )
        for call in program.calls:
            self._waiting_on[call.call_id] = len(call.dependencies)
        for call in program.roots():
            self._ready(program, call)
        self._dispatch()

    def _ready(self, program: WorkflowProgram, call: Call) -> None:
        now = self.events.now
        self._calls[call.call_id] = CallResult(
            call.call_id, program.workflow_id, program.workflow_type, call.agent_id, call.model,
            call.prompt_tokens, call.output_tokens, now, call.tool_latency_s,
        )  # fmt: skip
        meta = AppMetadata(
            program.workflow_type, program.workflow_id, call.agent_id, parent_request_ids=call.dependencies
        )
        request = QueuedRequest(
            request_id=call.call_id, tenant=TENANT, model=call.model, arrival_time=now,
            prompt_tokens=call.prompt_tokens, max_tokens=call.output_tokens, app_metadata=meta,
            annotations=None if self.annotator is None else self.annotator.annotate(program, call, now),
        )  # fmt: skip
        self.scheduler.submit(request, now)
        self._submitted = True

    def _ready_and_dispatch(self, program: WorkflowProgram, call: Call) -> None:
        self._ready(program, call)
        self._dispatch()

    def _dispatch(self) -> None:
        now = self.events.now
        self._report_runs(now)
        decisions = self.scheduler.dispatch(now)
        for decision in decisions:
            record = self._calls[decision.request_id]
            replica = self.replicas[decision.worker_id]
            record.worker_id, record.dispatch_time = replica.worker_id, now
            migration = self._migration(decision, record.workflow_id) if self.migrate_kv else None
            if migration is None:
                self._start(replica, record, decision)
            else:
                prefix, end = migration
                start = partial(self._migrated, replica, record, decision, prefix)
                self.events.at(end, Phase.READY, start)
        if decisions or self._submitted:  # nothing else changes a queue's depth
            self._record_depths(now)

    def _start(self, replica: _Replica, record: CallResult, decision: Decision) -> None:
        """Hand a placed call to its replica's engine (or record the replica's refusal)."""
        program = self._programs[record.workflow_id]
        call = program.call(record.call_id)
        now = self.events.now
        try:
            self._add_request(replica, program, call, decision)
        except (ValueError, InvalidRequest) as exc:  # what a live worker answers with INVALID_ARGUMENT
            self._reject(record, str(exc), now)
            return
        self._outputs[call.call_id] = []
        if replica.run is not None:
            self._cut(replica, replica.run, now)
        self._wake(replica)

    def _migration(self, decision: Decision, workflow_id: str) -> tuple[KvPrefix, float] | None:
        """The session's prefix to move for ``decision`` and when the move ends, if the module's
        rule says to move it; the move is recorded in ``migrations``."""
        source = self.replicas.get(decision.kv_source or "")
        target = self.replicas[decision.worker_id]
        runner = target.runner
        if source is None or source is target or not isinstance(runner, EmulatesKvTransfer):
            return None
        program = self._programs[workflow_id]
        prompt = self.prompts.prompt(program.workflow_type, program.call(decision.request_id))
        kv = source.engine.kv
        prefix = export_prefix(kv, source.runner, TENANT, token_ids=prompt, workflow_id=workflow_id)
        if prefix is None:
            return None
        saved = self._saved_tokens(target, prefix, len(prompt))
        seconds = runner.kv_transfer_seconds(prefix.num_tokens)
        if not worth_moving(saved, seconds, runner.recompute_seconds(saved) if saved else 0.0):
            return None
        now = self.events.now
        move = Migration(
            decision.request_id, source.worker_id, target.worker_id, prefix.num_tokens, saved, now, now + seconds
        )
        self.migrations.append(move)
        return prefix, move.end

    @staticmethod
    def _saved_tokens(target: _Replica, prefix: KvPrefix, prompt_tokens: int) -> int:
        """Tokens of the prompt that ``prefix`` (a prefix of it) covers and ``target`` does not
        cache yet, in whole blocks short of the prompt's last token (as the engine matches)."""
        kv = target.engine.kv
        if kv.cache is None:
            return 0
        blocks = min(prefix.num_tokens, prompt_tokens - 1) // kv.block_size
        cached = len(kv.cache.peek(TENANT, prefix.token_ids, blocks))
        return (blocks - cached) * kv.block_size

    def _migrated(self, replica: _Replica, record: CallResult, decision: Decision, prefix: KvPrefix) -> None:
        """The transfer is done: the prefix joins the replica's cache (unless its pool is full
        then: the call recomputes), and the call starts."""
        if replica.run is None:
            import_prefix(replica.engine.kv, replica.runner, prefix)
        else:  # step by step, the step in flight has cached its blocks already: import after it
            self._cut(replica, replica.run, self.events.now)
            replica.imports.append(prefix)
        self._start(replica, record, decision)

    def _add_request(self, replica: _Replica, program: WorkflowProgram, call: Call, decision: Decision) -> None:
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
            )
        )

    def _reject(self, record: CallResult, reason: str, now: float) -> None:
        """A call the replica refused: it ends at once with no output and its workflow goes on, as an
        agent that gets an error and carries on would (without the tool call a reply would have led
        to).  Reports count it under ``rejected_calls``, apart from the served ``calls``."""
        record.rejected, record.end_time = reason, now
        self.scheduler.complete(record.call_id)
        self.prompts.record_response(record.call_id, [])  # later prompts that quote it get nothing
        self._observe(record)
        self._release_dependents(self._programs[record.workflow_id], record, now)  # no output: no tool

    def _record_depths(self, now: float) -> None:
        """Append (now, model, depth) for each model whose depth changed since it was last recorded."""
        self._submitted = False
        for model, depth in self.scheduler.queue_depths().items():
            if self._depths.get(model) != depth:
                self._depths[model] = depth
                self.records.queue_depth.append((now, model, depth))

    def _wake(self, replica: _Replica) -> None:
        if not replica.busy:
            replica.busy = True
            self.events.at(self.events.now, Phase.STEP_START, lambda: self._step(replica))

    # ---- replicas ------------------------------------------------------------------------------

    def _step(self, replica: _Replica) -> None:
        if not replica.engine.has_unfinished():
            replica.busy = False
            return
        start = self.events.now
        plan = replica.engine.plan_decode_run() if self.fast_forward else None
        if plan is not None:
            run = replica.run = _Run(plan, start)
            self.events.at(run.ends[-1], Phase.STEP_DONE, partial(self._run_done, replica, run, plan.num_steps))
            return
        outputs = replica.engine.step()
        for seq in replica.engine.last_schedule.admitted:
            record = self._calls[seq.request_id]
            if record.start_time is None:
                record.start_time = start
        duration = replica.runner.last_step_seconds
        for seq, _ in replica.engine.last_schedule.chunks:
            self._service[seq.request_id] = self._service.get(seq.request_id, 0.0) + duration
        self.events.at(start + duration, Phase.STEP_DONE, lambda: self._step_done(replica, outputs))

    def _step_done(self, replica: _Replica, outputs: list[RequestOutput]) -> None:
        now = self.events.now
        finished: list[RequestOutput] = []
        for out in outputs:
            record = self._calls[out.request_id]
            self._outputs[out.request_id] += out.new_token_ids
            if out.new_token_ids and record.first_token_time is None:
                record.first_token_time = now
            if out.finished:
                finished.append(out)
        for out in finished:
            self._finish(out, now)
        self.scheduler.update_worker(replica.report(), now)
        self._dispatch()
        replica.busy = False
        self._wake(replica)

    def _run_done(self, replica: _Replica, run: _Run, steps: int) -> None:
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
        self._step_done(replica, outputs)

    def _cut(self, replica: _Replica, run: _Run, now: float) -> None:
        """A call joined ``replica`` mid-run: end the run with the step in flight at ``now``."""
        steps = bisect.bisect_left(run.ends, now) + 1  # steps whose end is at or after now, first one
        if steps < run.commit_steps:
            run.commit_steps = steps
            self.events.at(run.ends[steps - 1], Phase.STEP_DONE, partial(self._run_done, replica, run, steps))

    def _report_runs(self, now: float) -> None:
        """Give the scheduler the KV usage each replica mid-run reported at its last step boundary."""
        for replica in self.replicas.values():
            run = replica.run
            if run is None:
                continue
            done = min(bisect.bisect_right(run.ends, now), run.commit_steps)
            if done > run.reported_steps:
                run.reported_steps = done
                used = run.plan.kv_blocks_used_after(done)
                self.scheduler.update_worker(replica.report(kv_blocks_used=used), now)

    def _finish(self, out: RequestOutput, now: float) -> None:
        record = self._calls[out.request_id]
        record.end_time, record.cached_tokens = now, out.cached_tokens
        record.generated_tokens = out.completion_tokens
        service = self._service.pop(out.request_id, 0.0)
        self.scheduler.complete(out.request_id, now=now, service_s=service, output_tokens=out.completion_tokens)
        self.prompts.record_response(out.request_id, self._outputs.pop(out.request_id))
        self._observe(record)
        self._release_dependents(self._programs[record.workflow_id], record, now + record.tool_latency_s)

    def _observe(self, record: CallResult) -> None:
        if self.annotator is not None:
            last = self._remaining[record.workflow_id] == 1  # this call is its workflow's last one
            self.annotator.observe(self._programs[record.workflow_id], record, last)

    def _release_dependents(self, program: WorkflowProgram, record: CallResult, done_at: float) -> None:
        for child_id in self._children[program.workflow_id][record.call_id]:
            self._waiting_on[child_id] -= 1
            if self._waiting_on[child_id] == 0:
                child = program.call(child_id)
                self.events.at(done_at, Phase.READY, partial(self._ready_and_dispatch, program, child))
        self._maybe_end(program, done_at)

    def _maybe_end(self, program: WorkflowProgram, done_at: float) -> None:
        """A workflow ends when its last call, and the tool after it, is done."""
        workflow_id = program.workflow_id
        self._latest[workflow_id] = max(self._latest[workflow_id], done_at)
        self._remaining[workflow_id] -= 1
        if self._remaining[workflow_id] == 0:
            end = self._workflows[workflow_id].end_time = self._latest.pop(workflow_id)
            self._workflows_done += 1
            if self._backlog:
                following = self._backlog.pop()
                self.events.at(end + self._think_time_s, Phase.READY, lambda: self._arrive(following))
            self.prompts.forget([c.call_id for c in program.calls])
            self.scheduler.end_workflow(TENANT, workflow_id)
            del self._children[workflow_id], self._remaining[workflow_id]
