"""Agent depths for Aragog's intra-request order (seeds/002 §3.2, "Supporting complex workflows"):
a workflow's ready agents are scheduled by depth, deepest first, where an agent's depth is the
longest path from it to a leaf of the workflow's DAG.

The seed extracts the DAG from the DSPy program before execution; the scheduler sees only traffic,
so ``AgentGraph`` learns it: a call whose ``parent_request_ids`` name earlier calls of the same
workflow adds an edge from each parent's agent to its own.  An edge that would close a cycle (the
critique -> refine -> critique loop of self-refine) is a back edge and is ignored: the edges seen
first win, so the graph stays a DAG and every depth is finite.

    generate ──> critique ──> refine          depths: generate 2, critique 1, refine 0
                    ^───────────┘ (ignored)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class AgentGraph:
    """Per workflow type, the agents' edges seen so far and their depths.  Memory grows with the
    distinct (workflow type, agent) pairs it is told about, which the caller bounds."""

    def __init__(self, fixed: Mapping[tuple[str, str], int] | None = None) -> None:
        """``fixed``: (workflow type, agent) -> depth, known in advance; it wins over what is
        learned (an agent it does not name has depth 0)."""
        self._fixed = dict(fixed) if fixed is not None else None
        self._children: dict[str, dict[str, set[str]]] = {}  # workflow type -> agent -> children
        self._depths: dict[str, dict[str, int]] = {}  # workflow type -> agent -> depth (a cache)

    def observe(self, workflow_type: str, agent: str, parents: Iterable[str]) -> None:
        """``agent`` ran after each of ``parents`` (agents of the same workflow)."""
        if self._fixed is not None:
            return
        children = self._children.setdefault(workflow_type, {})
        children.setdefault(agent, set())
        changed = False
        for parent in parents:
            known = children.setdefault(parent, set())
            if agent in known or parent == agent or self._reaches(children, agent, parent):
                continue  # already known, or a back edge
            known.add(agent)
            changed = True
        if changed:
            self._depths.pop(workflow_type, None)

    def depth(self, workflow_type: str, agent: str) -> int:
        """The longest path from ``agent`` to a leaf; 0 for an agent with no known children."""
        if self._fixed is not None:
            return self._fixed.get((workflow_type, agent), 0)
        depths = self._depths.get(workflow_type)
        if depths is None:
            depths = self._depths[workflow_type] = self._all_depths(self._children.get(workflow_type, {}))
        return depths.get(agent, 0)

    @staticmethod
    def _reaches(children: Mapping[str, set[str]], start: str, goal: str) -> bool:
        seen, stack = {start}, [start]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child == goal:
                    return True
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        return False

    @staticmethod
    def _all_depths(children: Mapping[str, set[str]]) -> dict[str, int]:
        depths: dict[str, int] = {}

        def visit(agent: str) -> int:  # the graph is a DAG: no cycle guard needed
            if agent not in depths:
                depths[agent] = max((visit(child) + 1 for child in children.get(agent, ())), default=0)
            return depths[agent]

        for agent in children:
            visit(agent)
        return depths
