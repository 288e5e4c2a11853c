"""The value types at a workflow profile's boundary: what goes in, what comes out, its settings.

``CallRecord`` is one completed call as the profiler ingests it; ``IngestResult`` (with its
``IngestStatus``) says what ingesting it did; ``Annotation`` and ``StructurePrediction`` are the
predictions served for one request; ``ProfileConfig`` holds a profile's settings.  All are
immutable, hold no references to profile internals, and never raise on construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from clairvoyant.profiler.core.agent_names import AgentNameConfig
from clairvoyant.profiler.core.confidence import ConfidenceConfig, Tier
from clairvoyant.profiler.core.paths import NextAgents, Position, Remaining
from clairvoyant.profiler.core.priors import PriorConfig
from clairvoyant.profiler.core.remaining import RemainingConfig
from clairvoyant.profiler.core.synthesis import SynthesisConfig
from clairvoyant.profiler.core.templates import TemplateConfig
from clairvoyant.profiler.core.trace import TraceCall, WorkflowTrace


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One completed call, as the profiler learns it (the adapter maps CompletionRecord to this)."""

    request_id: str
    workflow_id: str
    agent_id: str
    start: float  # seconds, any one time scale per profile (the gateway's arrival time)
    end: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    upstream_agent_id: str | None = None
    parent_request_ids: tuple[str, ...] = ()
    tool: str | None = None
    workflow_version: str | None = None
    workflow_end: bool = False
    # Chained 16-token block hashes (clairvoyant.core.blockhash) of the prompt and the response.
    prompt_blocks: tuple[int, ...] = ()
    response_blocks: tuple[int, ...] = ()
    model: str | None = None  # the served model that ran the call, when the record names it

    def call(self) -> TraceCall:
        return TraceCall(
            self.request_id,
            self.agent_id,
            self.start,
            self.end,
            self.prompt_tokens,
            self.output_tokens,
            self.upstream_agent_id,
            self.parent_request_ids,
            self.tool,
        )


class IngestStatus(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # request id already ingested: nothing changed
    LATE = "late"  # its workflow instance was already closed
    STALE = "stale"  # an older workflow_version


@dataclass(frozen=True, slots=True)
class IngestResult:
    status: IngestStatus
    closed: tuple[WorkflowTrace, ...] = ()
    reset: bool = False  # a new workflow_version started a fresh profile


@dataclass(frozen=True, slots=True)
class Annotation:
    """The profiler's predictions for one request (mapped to SysAnnotations by the adapter)."""

    confidence: Tier
    output_len_p50: float | None = None
    output_len_p99: float | None = None  # the high-confidence bound
    path_expression: str = ""  # the remaining workflow, "" when not predicted
    expected_remaining_steps: float | None = None  # steps after the current one
    expected_remaining_time_s: float | None = None  # from the current step's end to the workflow's end
    next_agents: tuple[tuple[str, float], ...] = ()
    end_probability: float | None = None
    kairos_rank: int | None = None
    on_path: bool = True  # False: the instance left the expression and the position was re-anchored
    next_prompt_template: str = ""  # the prompt template of the most likely next agent (templates.py)
    # Per coming step (element 0 = the step after this request's): (agent id, expected calls),
    # most calls first (Pythia Alg. 4's ProjectGraph); () when the structure is not served.
    projection: tuple[tuple[tuple[str, float], ...], ...] = ()
    # The Gittins index of the workflow's remaining work, per second (remaining.py); None until the
    # remaining-work model has learned.
    remaining_gittins_index: float | None = None

    @staticmethod
    def empty() -> Annotation:
        return Annotation(Tier.NONE)


class StructurePrediction(NamedTuple):
    position: Position  # where the request's step is in the path model
    next_agents: NextAgents  # after the request's step
    remaining: Remaining  # after the request's step


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    idle_timeout_s: float = 600.0
    resynthesize_every: int = 20
    tables_every: int = 8  # closed instances between rebuilds of the annotation tables
    max_traces: int = 500  # the synthesis window
    max_seen_ids: int = 200_000  # request ids remembered for idempotency
    max_closed_ids: int = 20_000  # closed workflow ids remembered to spot late records
    residual_min_share: float = 0.05
    projection_steps: int = 8  # steps after a request's own that its annotation projects
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    templates: TemplateConfig = field(default_factory=TemplateConfig)
    agent_names: AgentNameConfig = field(default_factory=AgentNameConfig)  # off by default
    priors: PriorConfig = field(default_factory=PriorConfig)  # length priors for rare agents
    remaining: RemainingConfig = field(default_factory=RemainingConfig)

    @staticmethod
    def from_state(state: dict[str, Any]) -> ProfileConfig:
        """The config from ``dataclasses.asdict`` of one (a section an older state lacks gets its defaults)."""
        raw = dict(state)
        raw["synthesis"] = SynthesisConfig(**raw["synthesis"])
        raw["confidence"] = ConfidenceConfig(**raw["confidence"])
        raw["templates"] = TemplateConfig(**raw.get("templates", {}))
        raw["agent_names"] = AgentNameConfig(**raw.get("agent_names", {}))
        raw["priors"] = PriorConfig(**raw.get("priors", {}))
        raw["remaining"] = RemainingConfig(**raw.get("remaining", {}))
        return ProfileConfig(**raw)
