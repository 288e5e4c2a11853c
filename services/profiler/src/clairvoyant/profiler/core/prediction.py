"""Predictions for one request, from a profile's path model and its annotation tables.

``AnnotationTables.build`` precomputes what annotating reads (per-agent summaries, the Kairos rank,
expected-time values of the model's states); ``predict_structure`` places the request in the path
model and looks ahead from there.  All pure: nothing here changes a model, a table or its
arguments, and nothing raises on an agent or step the model has never seen (the position is
re-anchored or stays put).

The request being annotated is the *current* step.  When its agent also ran in the last step seen
so far and that step could be a fan-out still growing, ``current_position`` takes the more likely
reading (same step still growing vs. a new step) from the path model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from clairvoyant.profiler.core.paths import PathModel, Position
from clairvoyant.profiler.core.profile_types import StructurePrediction
from clairvoyant.profiler.core.ranking import AgentRanking, kairos_ranking
from clairvoyant.profiler.core.stats import AgentSummary, LearnedAgentStats
from clairvoyant.profiler.core.trace import Step


@dataclass
class AnnotationTables:
    summaries: dict[str, AgentSummary]
    ranking: AgentRanking
    time_values: list[float] | None  # per model state: expected time to the end; None without a model

    @staticmethod
    def build(agents: Mapping[str, LearnedAgentStats], model: PathModel | None) -> AnnotationTables:
        summaries = {a: s.summary() for a, s in agents.items()}
        ranking = kairos_ranking({a: list(s.remaining_s) for a, s in agents.items()})
        time_values = None
        if model is not None:
            service = {a: s.service_s.mean for a, s in summaries.items() if s.service_s is not None}
            gaps = {a: s.gap_after_s.mean for a, s in summaries.items() if s.gap_after_s is not None}
            time_values = model.time_values(service, gaps)
        return AnnotationTables(summaries, ranking, time_values)


def positions_after(model: PathModel, steps: Sequence[Step]) -> list[Position]:
    """positions[i] = the position after the first i steps."""
    positions = [model.start_position()]
    for step in steps:
        positions.append(model.advance(positions[-1], step))
    return positions


def current_position(
    model: PathModel, agent_id: str, steps: Sequence[Step], positions: list[Position]
) -> Position:
    """The position of a request of ``agent_id`` after ``steps`` (``positions`` = positions_after them)."""
    after_all = positions[-1]
    new_step, new_mass = model.advance_by(after_all, lambda e: e.partial_likelihood(agent_id))
    if steps and agent_id in steps[-1].agents:
        before_last = positions[-2]
        members = steps[-1].agents
        grown, grow_mass = model.advance_by(before_last, lambda e: e.growth_likelihood(members))
        _, last_mass = model.advance_by(before_last, lambda e: e.likelihood(steps[-1]))
        if grown is not None and grow_mass > last_mass * new_mass:
            return grown
    if new_step is not None:
        return new_step
    return model.advance(after_all, partial_agent=agent_id)  # re-anchors


def predict_structure(
    model: PathModel,
    tables: AnnotationTables,
    agent_id: str,
    steps: Sequence[Step],
    positions: list[Position],
) -> StructurePrediction:
    position = current_position(model, agent_id, steps, positions)
    nxt = model.future_agents(position)
    remaining = model.expected_remaining(position, time_values=tables.time_values)
    return StructurePrediction(position, nxt, remaining)
