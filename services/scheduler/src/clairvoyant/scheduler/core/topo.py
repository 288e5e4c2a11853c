"""Ayo-style topology-depth priority, Kairos's baseline (seeds/004, §2.2.2 and §7.1).

Kairos describes Ayo's scheduler as prioritising "requests in later execution stages based on
workflow depth" (§2.2.2, Fig. 7) and "requests with fewer remaining downstream stages" (§7.1);
both systems it compares with dispatch round robin.  A call's depth is read off the
parent_request_ids its application sends:

    depth(call) = 0                                     no parents
                = 1 + max(depth(parent) for known parents)   (a parent never seen counts as 0)

so the deepest call of a workflow runs first and equal depths go in arrival order (FCFS).
"""

from __future__ import annotations

from clairvoyant.scheduler.core.policies import PRESETS, PRIORITY_POLICIES, SchedulerPreset
from clairvoyant.scheduler.core.process_table import ProcessTable, ProgramKey, program_key
from clairvoyant.scheduler.core.types import QueuedRequest


@PRIORITY_POLICIES.register("topo-depth")
class TopoDepthPriority:
    """priority = the call's depth in its workflow's DAG (deeper = more urgent).

    Readings:
    - Depth rather than remaining stages: Ayo knows each application's graph in advance, and on
      graphs whose sinks all lie at the same depth "later stage" and "fewer remaining stages" give
      the same order.  The scheduler sees no graph, only the parent ids, so depth is what it can
      know without the profiler; ``expected_remaining_steps`` is deliberately not used, so the
      baseline needs no annotations.
    - A call's depth is fixed the first time it is ranked (every call is ranked before it is
      placed, so its children find it; with ``FixedPriority`` that is at submit); calls outside
      any program have depth 0.
    - Depths of programs that left the process table are forgotten lazily.
    """

    def __init__(self) -> None:
        self.programs: ProcessTable | None = None
        self._depth: dict[ProgramKey, dict[str, int]] = {}

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table

    def depth(self, request: QueuedRequest) -> int:
        key = program_key(request)
        if key is None or request.app_metadata is None:
            return 0
        known = self._depth.get(key)
        if known is None:
            self._forget_ended()
            known = self._depth[key] = {}
        depth = known.get(request.request_id)
        if depth is None:
            parents = request.app_metadata.parent_request_ids
            depth = 1 + max((known.get(p, 0) for p in parents), default=-1)
            known[request.request_id] = depth
        return depth

    def priority(self, request: QueuedRequest, now: float) -> float:
        return float(self.depth(request))

    def priority_is_fixed(self) -> bool:
        """A depth is fixed the first time it is computed (at submit), and its parents were
        submitted, so ranked, before it: the scheduler may keep the queue as a heap."""
        return True

    def _forget_ended(self) -> None:
        table = self.programs
        if table is not None and len(self._depth) > 2 * len(table) + 64:
            self._depth = {k: v for k, v in self._depth.items() if table.get(k) is not None}


PRESETS.register("topo-depth")(lambda: SchedulerPreset("topo-depth", "round-robin"))
