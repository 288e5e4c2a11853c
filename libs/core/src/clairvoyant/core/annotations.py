"""The profiler's predictions for one request, as the policies read them (``SysAnnotations``).

Plain frozen values: the profiler's core produces them, the scheduler's policies and the simulator
read them, and only the gRPC adapters convert them to and from the wire message
(``clairvoyant.core.wire``).  An unset prediction is None, as an unset optional field on the wire.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Confidence(enum.IntEnum):
    """How far the profiler trusts its profile of the workflow type (the wire enum's numbers)."""

    UNSPECIFIED = 0
    NONE = 1  # unknown workflow: nothing is predicted
    SHADOW = 2  # being learned: only safe predictions (output length) are served
    LOW = 3
    HIGH = 4


@dataclass(frozen=True, slots=True)
class LengthInterval:
    p50: float
    p99: float  # the high-confidence upper bound


@dataclass(frozen=True, slots=True)
class NextAgent:
    agent_id: str
    probability: float


@dataclass(frozen=True, slots=True)
class ProjectedCalls:
    """Pythia Alg. 4's ProjectGraph, one term: ``expected_calls`` of ``agent_id`` in the
    ``step``-th step after the request's own (1 = the next step)."""

    step: int
    agent_id: str
    expected_calls: float


@dataclass(frozen=True, slots=True)
class SysAnnotations:
    confidence: Confidence = Confidence.UNSPECIFIED
    predicted_output_len: LengthInterval | None = None
    predicted_path_regex: str = ""  # the remaining workflow as a bounded path expression
    expected_remaining_steps: float | None = None
    expected_remaining_time_s: float | None = None
    next_agents: tuple[NextAgent, ...] = ()
    prompt_composition: str = ""  # template of the most likely next prompt
    # Per-policy extras
    kairos_rank: float | None = None  # the agent's priority rank (Kairos)
    attained_service_s: float | None = None  # the program's attained service (Autellix)
    projection: tuple[ProjectedCalls, ...] = ()  # expected calls per agent in each coming step
    # The Gittins index of the workflow's remaining work, per second (higher: serve first)
    remaining_gittins_index: float | None = None
