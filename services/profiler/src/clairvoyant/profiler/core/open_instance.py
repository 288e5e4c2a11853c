"""One workflow instance still open in a profile: its calls, block-hash chains, trace and positions.

``OpenInstance.add`` takes calls in any order (a repeated request id replaces the earlier call and
rebuilds the trace); the trace is kept incrementally, so annotating never rebuilds a long session's
trace.  ``positions(model, model_id)`` returns the positions after each step prefix, advancing only
over the steps that changed since the last call for the same model.  Nothing here raises on valid
calls; ``to_state``/``from_state`` round-trip through plain dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from clairvoyant.profiler.core.paths import PathModel, Position
from clairvoyant.profiler.core.prediction import positions_after
from clairvoyant.profiler.core.remaining import Progress, ProgressTracker
from clairvoyant.profiler.core.templates import ChainStore, TemplateConfig
from clairvoyant.profiler.core.trace import IncrementalTrace, TraceCall


@dataclass
class OpenInstance:
    calls: dict[str, TraceCall] = field(default_factory=dict)
    chains: ChainStore | None = None  # block-hash chains of its calls, when records carry them
    last_activity: float = float("-inf")
    # The trace so far, kept incrementally, and the position cache: positions[i] = position after
    # i steps, valid for model_id up to step ``dirty_from`` (the first step a call added since may
    # have changed).
    trace: IncrementalTrace = field(default_factory=IncrementalTrace)
    model_id: int = -1
    cached_positions: list[Position] = field(default_factory=list)
    dirty_from: int = 0
    last_by_agent: dict[str, TraceCall] = field(default_factory=dict)  # its latest-starting call
    tracker: ProgressTracker = field(default_factory=ProgressTracker)  # aggregates for ``progress``
    first_start: float = float("inf")

    def add(self, call: TraceCall) -> None:
        if call.request_id in self.calls:  # a repeated id (idempotency window long passed): rebuild
            self.calls[call.request_id] = call
            self.trace = IncrementalTrace(self.calls.values())
            self.last_by_agent, self.tracker, self.first_start = {}, ProgressTracker(), float("inf")
            for c in self.calls.values():
                self._note(c)
            self.dirty_from = 0
            return
        self.calls[call.request_id] = call
        self.dirty_from = min(self.dirty_from, self.trace.add(call))
        self._note(call)

    def _note(self, call: TraceCall) -> None:
        self.tracker.add(call, 0)
        self.first_start = min(self.first_start, call.start)
        latest = self.last_by_agent.get(call.agent_id)
        if latest is None or call.start > latest.start:  # first of equal starts wins, as max() did
            self.last_by_agent[call.agent_id] = call

    def progress(self, agent: str, now: float | None, prompt_tokens: int) -> Progress:
        """What a call of ``agent`` starting at ``now`` (default: the latest activity) sees of this
        instance: every call added so far has ended (records arrive at the end of their call)."""
        at = self.last_activity if now is None else max(now, self.last_activity)
        return self.tracker.progress(agent, at, prompt_tokens, self.first_start, len(self.trace.steps))

    def positions(self, model: PathModel, model_id: int) -> list[Position]:
        """``prediction.positions_after`` of this instance's steps in ``model`` (``model_id``
        identifies it: a new id drops the cache)."""
        steps = self.trace.steps
        if self.model_id != model_id:
            self.model_id, self.cached_positions = model_id, positions_after(model, steps)
        elif self.dirty_from < len(steps) or len(self.cached_positions) != len(steps) + 1:
            positions = self.cached_positions[: min(self.dirty_from, len(steps)) + 1]
            for step in steps[len(positions) - 1 :]:
                positions.append(model.advance(positions[-1], step))
            self.cached_positions = positions
        self.dirty_from = len(steps)
        return self.cached_positions

    def to_state(self) -> dict[str, Any]:
        return {
            "calls": [_call_state(c) for c in self.calls.values()],
            "last_activity": self.last_activity,
            "chains": None if self.chains is None else self.chains.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], templates: TemplateConfig) -> OpenInstance:
        instance = cls(last_activity=float(state["last_activity"]))
        for c in state["calls"]:
            instance.add(TraceCall(**{**c, "parent_request_ids": tuple(c["parent_request_ids"])}))
        if state.get("chains") is not None:
            instance.chains = ChainStore.from_state(state["chains"], templates)
        return instance


def _call_state(call: TraceCall) -> dict[str, Any]:
    data = asdict(call)
    data["parent_request_ids"] = list(call.parent_request_ids)
    return data
