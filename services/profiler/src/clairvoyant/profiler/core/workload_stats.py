"""The workload statistics a profile learns from its closed workflow instances, and convergence.

``LearnedWorkloadStats.observe(trace, instance)`` folds one closed trace in: per-agent output lengths,
service times, remaining latency and gap after (``stats.LearnedAgentStats``), the gaps after each named
tool, and the workflow's step count and duration (sliding windows of ``max_traces``).
``converged()`` is Kairos §4.3's test over the agents' output lengths and paths, checked at doublings of
the closed workflows.  Never raises on a valid trace;
``to_state``/``from_state`` round-trip through plain lists and dicts.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from clairvoyant.profiler.core.stats import END_OF_WORKFLOW, ConvergenceTracker, LearnedAgentStats
from clairvoyant.profiler.core.trace import WorkflowTrace

CONVERGENCE_MIN_SHARE = 0.05  # agents with fewer of the calls do not gate convergence
TOOL_GAP_WINDOW = 4096


class LearnedWorkloadStats:
    def __init__(self, max_traces: int) -> None:
        self.agents: dict[str, LearnedAgentStats] = {}
        self.steps_per_instance: deque[float] = deque(maxlen=max_traces)
        self.duration_s: deque[float] = deque(maxlen=max_traces)
        self.steps_convergence = ConvergenceTracker()
        self.duration_convergence = ConvergenceTracker()
        self.tool_gaps: dict[str, deque[float]] = {}

    def observe(self, trace: WorkflowTrace, instance: int) -> None:
        """Learn from the closed ``trace``, the ``instance``-th closed instance (counted from 1)."""
        end = trace.end
        last_len: dict[str, float] = {}
        for i, group in enumerate(trace.calls):
            next_group = trace.calls[i + 1] if i + 1 < len(trace.calls) else ()
            next_start = min((c.start for c in next_group), default=None)
            # the agents of the next step, not how many of each: a fan-out's width is not the path
            next_step = (
                "+".join(sorted(set(trace.steps[i + 1].agents)))
                if i + 1 < len(trace.steps)
                else END_OF_WORKFLOW
            )
            for call in sorted(group, key=lambda c: c.start):
                gap = None if next_start is None else next_start - call.end
                stats = self.agents.setdefault(call.agent_id, LearnedAgentStats(call.agent_id))
                stats.add_call(
                    call.output_tokens,
                    call.end - call.start,
                    end - call.start,
                    gap,
                    last_len.get(call.agent_id),
                    instance,
                    next_step,
                )
            for call in group:
                last_len[call.agent_id] = float(call.output_tokens)
            if next_start is not None:
                for nxt in next_group:
                    if nxt.tool is not None:
                        gaps = self.tool_gaps.setdefault(nxt.tool, deque(maxlen=TOOL_GAP_WINDOW))
                        gaps.append(max(nxt.start - max(c.end for c in group), 0.0))
        self.steps_per_instance.append(float(len(trace.steps)))
        self.duration_s.append(end - trace.start)
        self.steps_convergence.add(float(len(trace.steps)), instance)
        self.duration_convergence.add(end - trace.start, instance)
        # Checks are counted in closed workflows: every agent's, after the whole trace is in.
        for agent in self.agents.values():
            agent.check_convergence(instance)
        self.steps_convergence.check(instance)
        self.duration_convergence.check(instance)

    def converged(self) -> bool:
        """Whether, for every agent that makes at least ``CONVERGENCE_MIN_SHARE`` of the calls, the
        output-length distribution and the distribution of the step after its calls have converged
        (``stats.ConvergenceTracker``).  Neither depends on load; service times, workflow length
        and duration are tracked but do not gate (docs/profiler.md, "Per-agent statistics and
        convergence")."""
        total = sum(s.calls for s in self.agents.values())
        if total == 0:
            return False
        return all(
            s.output_convergence.converged and s.path_convergence.converged
            for s in self.agents.values()
            if s.calls >= CONVERGENCE_MIN_SHARE * total
        )

    def tool_ttl_s(self, tool: str, percentile: float = 95.0) -> float | None:
        """SAGA's tool-call TTL: the percentile of the gap observed before calls after ``tool``."""
        gaps = self.tool_gaps.get(tool)
        return float(np.percentile(list(gaps), percentile)) if gaps else None

    def to_state(self) -> dict[str, Any]:
        return {
            "agents": {a: s.to_state() for a, s in self.agents.items()},
            "steps_per_instance": list(self.steps_per_instance),
            "duration_s": list(self.duration_s),
            "steps_convergence": self.steps_convergence.to_state(),
            "duration_convergence": self.duration_convergence.to_state(),
            "tool_gaps": {t: list(g) for t, g in self.tool_gaps.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], max_traces: int) -> LearnedWorkloadStats:
        """From a ``to_state`` dict (extra keys are ignored: a profile's state holds these inline)."""
        stats = cls(max_traces)
        stats.agents = {a: LearnedAgentStats.from_state(s) for a, s in state["agents"].items()}
        stats.steps_per_instance.extend(state["steps_per_instance"])
        stats.duration_s.extend(state["duration_s"])
        stats.steps_convergence = ConvergenceTracker.from_state(state["steps_convergence"])
        stats.duration_convergence = ConvergenceTracker.from_state(state["duration_convergence"])
        stats.tool_gaps = {t: deque(g, maxlen=TOOL_GAP_WINDOW) for t, g in state["tool_gaps"].items()}
        return stats
