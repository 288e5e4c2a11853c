"""Workflows in flight: which of their calls are ready, and when each workflow ends.

A call is ready when every call it depends on is done (its tool included); a workflow ends when its
last call, and the tool after it, is done.  Times are the caller's; nothing here schedules events.
"""

from __future__ import annotations

from clairvoyant.workloads.program import Call, WorkflowProgram


class WorkflowProgress:
    def __init__(self) -> None:
        self.programs: dict[str, WorkflowProgram] = {}  # every workflow started, by id
        self._waiting_on: dict[str, int] = {}  # call id -> unfinished dependencies
        self._children: dict[str, dict[str, tuple[str, ...]]] = {}  # workflow -> call -> dependents
        self._remaining: dict[str, int] = {}  # workflow -> calls not finished
        self._latest: dict[str, float] = {}  # workflow -> latest call end (tool included)

    def start(self, program: WorkflowProgram, now: float) -> list[Call]:
        """``program`` arrives at ``now``; returns its calls ready at once (its roots)."""
        self.programs[program.workflow_id] = program
        self._children[program.workflow_id] = program.dependents()
        self._remaining[program.workflow_id] = len(program.calls)
        self._latest[program.workflow_id] = now
        for call in program.calls:
            self._waiting_on[call.call_id] = len(call.dependencies)
        return list(program.roots())

    def is_last_call(self, workflow_id: str) -> bool:
        """Is one call of the workflow left unfinished (the one finishing now)?"""
        return self._remaining[workflow_id] == 1

    def call_done(self, program: WorkflowProgram, call_id: str, done_at: float) -> tuple[list[Call], float | None]:
        """A call of ``program`` is done, its tool at ``done_at``: the dependents ready then, and
        the workflow's end time if this was its last call (None otherwise)."""
        ready = []
        for child_id in self._children[program.workflow_id][call_id]:
            self._waiting_on[child_id] -= 1
            if self._waiting_on[child_id] == 0:
                ready.append(program.call(child_id))
        workflow_id = program.workflow_id
        self._latest[workflow_id] = max(self._latest[workflow_id], done_at)
        self._remaining[workflow_id] -= 1
        if self._remaining[workflow_id] != 0:
            return ready, None
        del self._children[workflow_id], self._remaining[workflow_id]
        return ready, self._latest.pop(workflow_id)
