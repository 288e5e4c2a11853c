"""Tool calls as the cache policies see them: between two calls of a workflow.

A call's ``app_metadata.tool`` names the tool that ran *before* it, so a tool's latency is the gap
from the end of the workflow's previous call to the start of the call that names it, and the
previous call's agent is the one that started the tool.  ``ToolCalls`` learns both:

* ``observe(call)`` returns ``(tool, latency)`` when ``call`` closes a tool gap;
* ``tool_after(tenant, workflow_type, agent)`` is the tool that agent's calls have started at least
  ``min_share`` of the times they were followed at all ("" when none; a tie goes to the tool): a
  completion of that agent is then a tool call starting.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from clairvoyant.policy.cache import CompletedCall, lineage_key, tool_of
from clairvoyant.policy.cache_paths import BoundedMap


class ToolGap(NamedTuple):
    tool: str
    latency_s: float


class _Last(NamedTuple):
    end: float
    agent_id: str


class ToolCalls:
    """Per workflow, the last call's end and agent; per (tenant, type, agent), what followed it."""

    def __init__(self, *, min_share: float = 0.5, max_workflows: int = 4096, max_agents: int = 4096) -> None:
        self.min_share = min_share
        self.last: BoundedMap[tuple[str, str], _Last] = BoundedMap(max_workflows)
        self.followers: BoundedMap[tuple[str, str, str], Counter[str]] = BoundedMap(max_agents)

    def observe(self, call: CompletedCall) -> ToolGap | None:
        """Record ``call``; the tool gap it closes (None when it names no tool or follows nothing)."""
        key, meta = lineage_key(call), call.app_metadata
        if key is None or meta is None:
            return None
        previous = self.last.get(key)
        self.last[key] = _Last(call.end, meta.agent_id)
        if previous is None:
            return None
        tool = tool_of(call)
        agent_key = (call.tenant, meta.workflow_type_id, previous.agent_id)
        counts = self.followers.get(agent_key) or Counter()
        counts[tool] += 1
        self.followers[agent_key] = counts
        return ToolGap(tool, max(0.0, call.start - previous.end)) if tool else None

    def tool_after(self, tenant: str, workflow_type_id: str, agent_id: str) -> str:
        counts = self.followers.get((tenant, workflow_type_id, agent_id))
        if not counts:
            return ""
        tool, seen = min(
            counts.items(), key=lambda item: (-item[1], not item[0], item[0])
        )  # a tool wins a tie
        return tool if tool and seen >= self.min_share * sum(counts.values()) else ""

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.last.pop((tenant, workflow_id), None)


__all__ = ["ToolCalls", "ToolGap"]
