"""The trace model: agent calls of one workflow instance, grouped into steps.

A *step* is one agent call or a group of calls that ran in parallel, recognised with Kairos'
sweep line over the calls' spans (seed 004, §4.2), split by parent request ids and upstream agents
where the application sends them.  ``build_trace(workflow_id, calls)`` returns the
``WorkflowTrace`` of calls given in any order; ``IncrementalTrace`` keeps the same trace as calls
arrive and reports the first step a new call may have changed.  ``Step`` raises ``ValueError``
without agents.  The reconstruction and its choices: docs/profiler.md, "Traces and steps".
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceCall:
    """One completed LLM call of a workflow instance (times in seconds on any one time scale)."""

    request_id: str
    agent_id: str
    start: float
    end: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    upstream_agent_id: str | None = None
    parent_request_ids: tuple[str, ...] = ()
    tool: str | None = None  # the tool call that preceded this request, when the app says so


@dataclass(frozen=True, slots=True, order=True)
class Step:
    """The symbol a path expression matches: the sorted agent ids of one step (a multiset)."""

    agents: tuple[str, ...]

    @staticmethod
    def of(*agents: str) -> Step:
        if not agents:
            raise ValueError("a step has at least one agent")
        return Step(tuple(sorted(agents)))

    @property
    def parallel(self) -> bool:
        return len(self.agents) > 1

    def __str__(self) -> str:
        return self.agents[0] if len(self.agents) == 1 else "{" + ", ".join(self.agents) + "}"


StepLike = Step | str | Sequence[str]


def as_step(value: StepLike) -> Step:
    """``"a"`` -> Step(("a",)); ``("b", "a")`` -> Step(("a", "b")); a Step is returned as is."""
    if isinstance(value, Step):
        return value
    if isinstance(value, str):
        return Step((value,))
    return Step.of(*value)


def as_steps(values: Iterable[StepLike]) -> tuple[Step, ...]:
    return tuple(as_step(v) for v in values)


@dataclass(frozen=True, slots=True)
class WorkflowTrace:
    """One workflow instance, reconstructed: ``calls[i]`` are the calls of ``steps[i]``."""

    workflow_id: str
    steps: tuple[Step, ...]
    calls: tuple[tuple[TraceCall, ...], ...] = field(repr=False)

    @property
    def start(self) -> float:
        return min(c.start for c in self.calls[0]) if self.calls else 0.0

    @property
    def end(self) -> float:
        return max(c.end for group in self.calls for c in group) if self.calls else 0.0

    def all_calls(self) -> list[TraceCall]:
        return [c for group in self.calls for c in group]


def _overlap_components(calls: list[TraceCall]) -> list[list[TraceCall]]:
    """The sweep line: calls sorted by start; a call joins the running component while it starts
    before the component's latest end."""
    components: list[list[TraceCall]] = []
    current_end = float("-inf")
    for call in calls:
        if components and call.start < current_end:
            components[-1].append(call)
            current_end = max(current_end, call.end)
        else:
            components.append([call])
            current_end = call.end
    return components


def _layers(component: list[TraceCall]) -> list[list[TraceCall]]:
    """Split an overlap component into dependency layers (parents / upstream agent inside it)."""
    if len(component) == 1:
        return [component]
    by_id = {c.request_id: c for c in component}
    depth: dict[str, int] = {}
    for index, call in enumerate(component):  # sorted by start, so parents come first
        # Only parents that started earlier count (a skewed clock cannot create a cycle).
        parents = [by_id[p] for p in call.parent_request_ids if p in depth]
        if not parents and call.upstream_agent_id is not None and not call.parent_request_ids:
            earlier = [c for c in component[:index] if c.agent_id == call.upstream_agent_id]
            parents = earlier[-1:]
        depth[call.request_id] = 1 + max((depth[p.request_id] for p in parents), default=-1)
    layers: dict[int, list[TraceCall]] = {}
    for call in component:
        layers.setdefault(depth[call.request_id], []).append(call)
    return [layers[d] for d in sorted(layers)]


def build_trace(workflow_id: str, calls: Iterable[TraceCall]) -> WorkflowTrace:
    """Reconstruct the steps of one workflow instance from its calls (any order)."""
    ordered = sorted(calls, key=lambda c: (c.start, c.end, c.request_id))
    steps: list[Step] = []
    groups: list[tuple[TraceCall, ...]] = []
    for component in _overlap_components(ordered):
        for layer in _layers(component):
            steps.append(Step.of(*(c.agent_id for c in layer)))
            groups.append(tuple(layer))
    return WorkflowTrace(workflow_id, tuple(steps), tuple(groups))


class IncrementalTrace:
    """``build_trace`` for an instance that is still open: calls are added one at a time (in any
    order) and only the tail of the sweep that a new call can change is recomputed.

    The sweep's component boundaries before the component of the new call's predecessor (in start
    order) depend only on the calls before it, so they stay; the sweep restarts there:

        sorted calls:  [c0 c1 c2][c3 c4][c5 c6 c7]      new call x sorts after c6
                                          ^ restart here: c5.. and x are swept again

    ``steps``/``calls`` always equal ``build_trace`` of the calls added so far; ``add`` returns the
    index of the first step that may differ from before (steps before it are unchanged)."""

    def __init__(self, calls: Iterable[TraceCall] = ()) -> None:
        self._keys: list[tuple[float, float, str]] = []
        self._calls: list[TraceCall] = []
        self._component_starts: list[int] = []  # index into _calls of each component's first call
        self._component_steps: list[int] = []  # steps before each component
        self.steps: list[Step] = []
        self.groups: list[tuple[TraceCall, ...]] = []
        for call in calls:
            self.add(call)

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, call: TraceCall) -> int:
        key = (call.start, call.end, call.request_id)
        index = bisect.bisect_right(self._keys, key)
        self._keys.insert(index, key)
        self._calls.insert(index, call)
        # the component holding the predecessor (or the first) is the first that may change
        component = max(bisect.bisect_right(self._component_starts, index - 1) - 1, 0)
        restart = self._component_starts[component] if self._component_starts else 0
        first_step = self._component_steps[component] if self._component_steps else 0
        del self._component_starts[component:]
        del self._component_steps[component:]
        del self.steps[first_step:]
        del self.groups[first_step:]
        position = restart
        for part in _overlap_components(self._calls[restart:]):
            self._component_starts.append(position)
            self._component_steps.append(len(self.steps))
            position += len(part)
            for layer in _layers(part):
                self.steps.append(Step.of(*(c.agent_id for c in layer)))
                self.groups.append(tuple(layer))
        return first_step

    def trace(self, workflow_id: str) -> WorkflowTrace:
        return WorkflowTrace(workflow_id, tuple(self.steps), tuple(self.groups))
