"""The records of one simulated run, kept as it goes and assembled into ``RunRecords`` at its end.

A ``CallResult`` per call that became ready, a ``WorkflowRecord`` per workflow that arrived, and
each model's global queue depth whenever it changes.  The simulator fills in the times; this
module only keeps and orders them.
"""

from __future__ import annotations

from collections.abc import Mapping

from clairvoyant.bench.records import CallResult, RunRecords, WorkflowRecord
from clairvoyant.workloads.program import Call, WorkflowProgram


class RunRecorder:
    def __init__(self) -> None:
        self.records = RunRecords()
        self.calls: dict[str, CallResult] = {}
        self.workflows: dict[str, WorkflowRecord] = {}
        self._depths: dict[str, int] = {}  # model -> global queue depth last recorded

    def workflow_arrived(self, program: WorkflowProgram, now: float, lower_bound_s: float) -> None:
        self.workflows[program.workflow_id] = WorkflowRecord(
            program.workflow_id, program.workflow_type, now, len(program.calls), lower_bound_s=lower_bound_s
        )

    def call_ready(self, program: WorkflowProgram, call: Call, now: float) -> CallResult:
        record = self.calls[call.call_id] = CallResult(
            call.call_id, program.workflow_id, program.workflow_type, call.agent_id, call.model,
            call.prompt_tokens, call.output_tokens, now, call.tool_latency_s,
        )  # fmt: skip
        return record

    def started(self, call_id: str, start: float) -> None:
        """The call's engine step began at ``start`` (its first one counts)."""
        record = self.calls[call_id]
        if record.start_time is None:
            record.start_time = start

    def queue_depths(self, now: float, depths: Mapping[str, int]) -> None:
        """Append (now, model, depth) for each model whose depth changed since it was last recorded."""
        for model, depth in depths.items():
            if self._depths.get(model) != depth:
                self._depths[model] = depth
                self.records.queue_depth.append((now, model, depth))

    def assemble(self, now: float, preemptions: int, *, partial: bool) -> RunRecords:
        """The records at ``now``, calls and workflows in order of arrival.  Raises RuntimeError
        when a workflow has not finished, unless the run is ``partial`` (stopped early)."""
        unfinished = [w.workflow_id for w in self.workflows.values() if w.end_time is None]
        if unfinished and not partial:
            raise RuntimeError(f"{len(unfinished)} workflows never finished (e.g. {unfinished[0]})")
        self.records.workflows = sorted(self.workflows.values(), key=lambda w: (w.arrival_time, w.workflow_id))
        self.records.calls = sorted(self.calls.values(), key=lambda c: (c.ready_time, c.call_id))
        self.records.preemptions = preemptions
        first = min((w.arrival_time for w in self.records.workflows), default=0.0)
        self.records.duration_s = now - first
        return self.records
