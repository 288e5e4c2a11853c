"""Ayo-style topology-depth priority, Kairos's baseline (seeds/004, §2.2.2 and §7.1).

Kairos describes Ayo's scheduler as prioritising "requests in later execution stages based on
workflow depth" (§2.2.2, Fig. 7) and "requests with fewer remaining downstream stages" (§7.1);
both systems it compares with dispatch round robin.  A call's depth is read off the
parent_request_ids its application sends:

    depth(call) = 0                                     no parents
                = 1 + max(depth(parent) for parents)   (a parent never submitted counts as 0)

so the deepest call of a workflow runs first and equal depths go in arrival order (FCFS).
"""

from __future__ import annotations

from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable, program_key
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    PriorityChanges,
    ProgramRows,
)
from clairvoyant.policy.types import QueuedRequest


@PRIORITY_POLICIES.register("topo-depth")
class TopoDepthPriority:
    """priority = the call's depth in its workflow's DAG (deeper = more urgent).

    Readings:
    - Depth rather than remaining stages: Ayo knows each application's graph in advance, and on
      graphs whose sinks all lie at the same depth "later stage" and "fewer remaining stages" give
      the same order.  The scheduler sees no graph, only the parent ids, so depth is what it can
      know without the profiler; ``expected_remaining_steps`` is deliberately not used, so the
      baseline needs no annotations.
    - A call's depth is fixed when it is first submitted, from the depths of the parents
      submitted before it: the process table's ``Program.call_depth``, kept for the program's
      life.  Calls outside any program have depth 0, and so do the calls of a program whose entry
      is gone while they wait (``end_workflow``).
    - The value reads only the call and its program's entry, so only the programs an update
      touched are re-ranked (``IncrementalPriority``); the depth itself does not change.
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def __init__(self) -> None:
        self.programs: ProcessTable | None = None
        self._rows = ProgramRows()

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table

    def depth(self, request: QueuedRequest) -> int:
        program = self.programs.get(program_key(request)) if self.programs is not None else None
        return 0 if program is None else program.call_depth.get(request.request_id, 0)

    def priority(self, request: QueuedRequest, now: float) -> float:
        return float(self.depth(request))

    def priority_changes(self, now: float) -> PriorityChanges:
        return self._rows.changes(self.programs)


PRESETS.register_preset("topo-depth", Preset("topo-depth", "round-robin"))
