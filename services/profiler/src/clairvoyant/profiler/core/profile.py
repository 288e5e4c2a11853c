"""WorkflowProfile: everything the profiler knows about one (tenant, workflow type), in memory.

It ingests completed-call records one by one (idempotent on request id), keeps the open workflow
instances, closes an instance on its explicit end marker (``workflow_end``) or after
``idle_timeout_s`` without activity (``tick(now)``; times are passed in, never read), learns from each
closed instance (trace, automaton, per-agent statistics, confidence), re-synthesises the path
expression every ``resynthesize_every`` closed instances from a sliding window of recent traces,
and answers ``annotate`` from precomputed tables.

    ingest(record) ──> open instance ──end marker / idle──> close ──> trace (sweep line)
                                                               ├─> automaton, agent stats, convergence
                                                               ├─> acceptance -> confidence tier
                                                               ├─> every k: synthesize -> PathModel
                                                               └─> block chains -> prompt templates

Choices:
* A record for an instance that was already closed (late delivery) is not counted; it is reported as
  LATE.  A record whose ``workflow_version`` differs from the current one resets the profile to a
  fresh shadow profile of the new version (Pythia §5); records of a version seen before that is not
  the current one are STALE and dropped.
* In SHADOW only the output-length interval is served (the proto's "only safe predictions").
* The annotation tables (per-agent summaries, Kairos rank, expected-time values) are rebuilt on the
  ingestion path, at each re-synthesis and every ``tables_every`` closed instances (``refresh_tables``),
  not on the annotate path: a rebuild costs ~10 ms with 7 agents, which at every close would cap
  ingestion near 1,000 records/s and put that spike into annotate's tail.  Between rebuilds the
  statistics served are up to ``tables_every - 1`` instances old.
* Records that carry block-hash chains have them kept, deduplicated, while their instance is open
  (``templates.ChainStore``: hashes only, bounded per call and per instance); the templates learned
  from them at close are served as ``next_prompt_template`` for the most likely next agent.
* The request being annotated is the *current* step.  When its agent also ran in the last step seen
  so far and that step could be a fan-out still growing, the more likely reading (same step still
  growing vs. a new step) is taken from the path model.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

import numpy as np

from clairvoyant.profiler.core import confidence as conf
from clairvoyant.profiler.core.automaton import TransitionAutomaton
from clairvoyant.profiler.core.confidence import ConfidenceConfig, ConfidenceState, Tier
from clairvoyant.profiler.core.expr import parse, to_text
from clairvoyant.profiler.core.paths import NextAgents, PathModel, Position, Remaining
from clairvoyant.profiler.core.ranking import AgentRanking, kairos_ranking
from clairvoyant.profiler.core.stats import AgentStats, AgentSummary, ConvergenceTracker, Summary
from clairvoyant.profiler.core.synthesis import SynthesisConfig, synthesize
from clairvoyant.profiler.core.templates import AgentTemplate, ChainStore, TemplateConfig, TemplateLearner
from clairvoyant.profiler.core.trace import Call, IncrementalTrace, Step, StepLike, WorkflowTrace, as_steps

CONVERGENCE_MIN_SHARE = 0.05  # agents with fewer of the calls do not gate convergence


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

    def call(self) -> Call:
        return Call(
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
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    templates: TemplateConfig = field(default_factory=TemplateConfig)


@dataclass
class _Open:
    calls: dict[str, Call] = field(default_factory=dict)
    chains: ChainStore | None = None  # block-hash chains of its calls, when records carry them
    last_activity: float = float("-inf")
    # The trace so far, kept incrementally (annotate never rebuilds a long session's trace), and
    # the position cache: positions[i] = position after i steps, valid for model_id up to step
    # ``dirty_from`` (the first step a call added since may have changed).
    trace: IncrementalTrace = field(default_factory=IncrementalTrace)
    model_id: int = -1
    positions: list[Position] = field(default_factory=list)
    dirty_from: int = 0
    last_by_agent: dict[str, Call] = field(default_factory=dict)  # its latest-starting call

    def add(self, call: Call) -> None:
        if call.request_id in self.calls:  # a repeated id (idempotency window long passed): rebuild
            self.calls[call.request_id] = call
            self.trace = IncrementalTrace(self.calls.values())
            self.last_by_agent = {}
            for c in self.calls.values():
                self._note(c)
            self.dirty_from = 0
            return
        self.calls[call.request_id] = call
        self.dirty_from = min(self.dirty_from, self.trace.add(call))
        self._note(call)

    def _note(self, call: Call) -> None:
        latest = self.last_by_agent.get(call.agent_id)
        if latest is None or call.start > latest.start:  # first of equal starts wins, as max() did
            self.last_by_agent[call.agent_id] = call


@dataclass
class _Derived:
    summaries: dict[str, AgentSummary]
    ranking: AgentRanking
    time_values: list[float] | None


class WorkflowProfile:
    def __init__(self, tenant: str, workflow_type_id: str, config: ProfileConfig | None = None) -> None:
        self.tenant = tenant
        self.workflow_type_id = workflow_type_id
        self.config = config or ProfileConfig()
        self._open: dict[str, _Open] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closed_ids: OrderedDict[str, None] = OrderedDict()
        self._old_versions: set[str] = set()
        self.confidence = ConfidenceState()
        self._reset_learning()

    def _reset_learning(self) -> None:
        self.traces: deque[tuple[Step, ...]] = deque(maxlen=self.config.max_traces)
        self.automaton = TransitionAutomaton()
        self.agents: dict[str, AgentStats] = {}
        self.steps_per_instance: deque[float] = deque(maxlen=self.config.max_traces)
        self.duration_s: deque[float] = deque(maxlen=self.config.max_traces)
        self.steps_convergence = ConvergenceTracker()
        self.duration_convergence = ConvergenceTracker()
        self.tool_gaps: dict[str, deque[float]] = {}
        self.instances = 0
        self.since_synthesis = 0
        self.since_tables = 0
        self.model: PathModel | None = None
        self.acceptance: float | None = None
        self.structured: bool = False
        self._model_id = 0
        self._derived: _Derived | None = None
        self.templates = TemplateLearner(self.config.templates)

    # ----------------------------------------------------------------------------- ingestion

    def ingest(self, record: CallRecord) -> IngestResult:
        if record.request_id in self._seen:
            return IngestResult(IngestStatus.DUPLICATE)
        if record.workflow_version is not None and record.workflow_version in self._old_versions:
            return IngestResult(IngestStatus.STALE)
        self._remember(self._seen, record.request_id, self.config.max_seen_ids)
        reset = False
        previous_version = self.confidence.version
        self.confidence, reset = conf.on_version(self.confidence, record.workflow_version)
        if reset:
            if previous_version is not None:
                self._old_versions.add(previous_version)
            self._open.clear()
            self._reset_learning()
        if record.workflow_id in self._closed_ids:
            return IngestResult(IngestStatus.LATE, reset=reset)
        instance = self._open.setdefault(record.workflow_id, _Open())
        instance.add(record.call())
        if record.prompt_blocks or record.response_blocks:
            if instance.chains is None:
                instance.chains = ChainStore(self.config.templates)
            instance.chains.add(
                record.request_id, record.agent_id, record.start, record.prompt_blocks, record.response_blocks
            )
        instance.last_activity = max(instance.last_activity, record.end)
        closed: tuple[WorkflowTrace, ...] = ()
        if record.workflow_end:
            closed = (self._close(record.workflow_id),)
        return IngestResult(IngestStatus.ACCEPTED, closed, reset)

    def tick(self, now: float) -> tuple[WorkflowTrace, ...]:
        """Close the instances idle for ``idle_timeout_s`` at time ``now``."""
        idle = [w for w, o in self._open.items() if now - o.last_activity >= self.config.idle_timeout_s]
        return tuple(self._close(w) for w in sorted(idle))

    @staticmethod
    def _remember(store: OrderedDict[str, None], key: str, limit: int) -> None:
        store[key] = None
        while len(store) > limit:
            store.popitem(last=False)

    def _close(self, workflow_id: str) -> WorkflowTrace:
        instance = self._open.pop(workflow_id)
        self._remember(self._closed_ids, workflow_id, self.config.max_closed_ids)
        trace = instance.trace.trace(workflow_id)
        self._learn(trace)
        if instance.chains is not None:
            self.templates.learn(instance.chains.calls())
        return trace

    def _learn(self, trace: WorkflowTrace) -> None:
        self.instances += 1
        self.since_synthesis += 1
        self.traces.append(trace.steps)
        self.automaton.add(trace.steps)
        end = trace.end
        last_len: dict[str, float] = {}
        for i, group in enumerate(trace.calls):
            next_group = trace.calls[i + 1] if i + 1 < len(trace.calls) else ()
            next_start = min((c.start for c in next_group), default=None)
            for call in sorted(group, key=lambda c: c.start):
                gap = None if next_start is None else next_start - call.end
                stats = self.agents.setdefault(call.agent_id, AgentStats(call.agent_id))
                stats.add_call(
                    call.output_tokens,
                    call.end - call.start,
                    end - call.start,
                    gap,
                    last_len.get(call.agent_id),
                    self.instances,
                )
            for call in group:
                last_len[call.agent_id] = float(call.output_tokens)
            if next_start is not None:
                for nxt in next_group:
                    if nxt.tool is not None:
                        gaps = self.tool_gaps.setdefault(nxt.tool, deque(maxlen=4096))
                        gaps.append(max(nxt.start - max(c.end for c in group), 0.0))
        self.steps_per_instance.append(float(len(trace.steps)))
        self.duration_s.append(end - trace.start)
        self.steps_convergence.observe(self.steps_per_instance, self.instances, self.instances)
        self.duration_convergence.observe(self.duration_s, self.instances, self.instances)
        accepted = self.model.accepts(trace.steps) if self.model is not None else None
        # Every resynthesize_every instances, stretched to an eighth of those seen once there are
        # many: a synthesis over the 500-trace window costs ~100 ms.
        every = max(self.config.resynthesize_every, self.instances // 8)
        if self.model is None or self.since_synthesis >= every:
            self.resynthesize()
        self.confidence = conf.on_instance(
            self.confidence, accepted, self.converged(), self.config.confidence
        )
        self.since_tables += 1
        if self._derived is None or self.since_tables >= self.config.tables_every:
            self.refresh_tables()

    def resynthesize(self) -> None:
        if not self.traces:
            return
        result = synthesize(list(self.traces), None, self.config.synthesis)
        self.model = PathModel(result.expr, result.weights)
        self.acceptance = result.acceptance
        self.structured = result.structured
        self.since_synthesis = 0
        self._model_id += 1
        self.confidence = conf.on_synthesized(self.confidence, result.acceptance)
        self._derived = None

    def converged(self) -> bool:
        """Kairos §4.3's test: the single-request execution latency (service time) distribution of
        every agent that makes at least ``CONVERGENCE_MIN_SHARE`` of the calls has converged
        (``stats.ConvergenceTracker``: doubling checks, relative W1 <= 0.1, latched).  Workflow
        length and duration are tracked (``steps_convergence``, ``duration_convergence``) but do
        not gate: the paper does not test them, and on heterogeneous real workflows they do not
        settle within hundreds of runs.  Rare agents are left out because a 2% agent would need
        many times more workflows to reach the same sample counts."""
        total = sum(s.calls for s in self.agents.values())
        if total == 0:
            return False
        return all(
            s.service_convergence.converged
            for s in self.agents.values()
            if s.calls >= CONVERGENCE_MIN_SHARE * total
        )

    # ---------------------------------------------------------------------------- prediction

    def refresh_tables(self) -> None:
        """Rebuild the annotation tables now (per-agent summaries, Kairos rank, time values)."""
        self._derived = None
        self.since_tables = 0
        self._tables()

    def _tables(self) -> _Derived:
        if self._derived is None:
            summaries = {a: s.summary() for a, s in self.agents.items()}
            ranking = kairos_ranking({a: list(s.remaining_s) for a, s in self.agents.items()})
            time_values = None
            if self.model is not None:
                service = {a: s.service_s.mean for a, s in summaries.items() if s.service_s is not None}
                gaps = {a: s.gap_after_s.mean for a, s in summaries.items() if s.gap_after_s is not None}
                time_values = self.model.time_values(service, gaps)
            self._derived = _Derived(summaries, ranking, time_values)
        return self._derived

    def _positions(self, steps: Sequence[Step]) -> list[Position]:
        """positions[i] = the position after the first i steps."""
        assert self.model is not None
        positions = [self.model.start_position()]
        for step in steps:
            positions.append(self.model.advance(positions[-1], step))
        return positions

    def _open_positions(self, instance: _Open) -> list[Position]:
        """``_positions`` of an open instance's steps, advancing only over the steps that changed
        since the last call (``_Open.dirty_from``)."""
        assert self.model is not None
        steps = instance.trace.steps
        if instance.model_id != self._model_id:
            instance.model_id, instance.positions = self._model_id, self._positions(steps)
        elif instance.dirty_from < len(steps) or len(instance.positions) != len(steps) + 1:
            positions = instance.positions[: min(instance.dirty_from, len(steps)) + 1]
            for step in steps[len(positions) - 1 :]:
                positions.append(self.model.advance(positions[-1], step))
            instance.positions = positions
        instance.dirty_from = len(steps)
        return instance.positions

    def _current_position(self, agent_id: str, steps: Sequence[Step], positions: list[Position]) -> Position:
        assert self.model is not None
        model = self.model
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

    def annotate(
        self,
        agent_id: str,
        workflow_id: str | None = None,
        prompt_tokens: int | None = None,
        history: Sequence[StepLike] | None = None,
    ) -> Annotation:
        """Predictions for a request of ``agent_id``.  The position is ``history`` (steps already
        taken, when given) or what was ingested so far for ``workflow_id``.  ``prompt_tokens`` is
        accepted for the interface; the length predictors do not use it yet."""
        del prompt_tokens
        if not self._seen:
            return Annotation.empty()  # never heard of: the reactive tier
        tables = self._tables()
        instance = self._open.get(workflow_id) if workflow_id is not None else None
        previous_len = None
        if instance is not None:
            latest = instance.last_by_agent.get(agent_id)
            if latest is not None:
                previous_len = float(latest.output_tokens)
        summary = tables.summaries.get(agent_id)
        interval = summary.length_interval(previous_len) if summary is not None else None
        p50, p99 = interval if interval is not None else (None, None)
        tier = self.confidence.tier
        if tier is Tier.SHADOW or self.model is None:
            return Annotation(Tier.SHADOW, p50, p99)
        predicted = self.predict(agent_id, workflow_id, history)
        assert predicted is not None
        position, nxt, remaining = predicted
        return Annotation(
            tier,
            p50,
            p99,
            self.model.residual(position, self.config.residual_min_share),
            remaining.steps,
            remaining.time_s,
            nxt.agents,
            nxt.end_probability,
            tables.ranking.rank.get(agent_id),
            position.on_path,
            self.templates.template(nxt.agents[0][0]) if nxt.agents else "",
        )

    def predict(
        self, agent_id: str, workflow_id: str | None = None, history: Sequence[StepLike] | None = None
    ) -> StructurePrediction | None:
        """The structure predictions for a request of ``agent_id`` whatever the tier (``annotate``
        serves them only in LOW and HIGH); None before the first expression exists."""
        if self.model is None:
            return None
        tables = self._tables()
        instance = self._open.get(workflow_id) if workflow_id is not None else None
        steps: Sequence[Step]
        if history is not None:
            steps = as_steps(history)
            positions = self._positions(steps)
        elif instance is not None:
            positions = self._open_positions(instance)
            steps = instance.trace.steps
        else:
            steps, positions = (), [self.model.start_position()]
        position = self._current_position(agent_id, steps, positions)
        nxt = self.model.future_agents(position)
        remaining = self.model.expected_remaining(position, time_values=tables.time_values)
        return StructurePrediction(position, nxt, remaining)

    # ---------------------------------------------------------------------------- inspection

    @property
    def expression(self) -> str:
        return to_text(self.model.expr) if self.model is not None else ""

    def agent_summaries(self) -> dict[str, AgentSummary]:
        return dict(self._tables().summaries)

    def ranking(self) -> AgentRanking:
        return self._tables().ranking

    def tool_ttl_s(self, tool: str, percentile: float = 95.0) -> float | None:
        """SAGA's tool-call TTL: the percentile of the gap observed before calls after ``tool``."""
        gaps = self.tool_gaps.get(tool)
        return float(np.percentile(list(gaps), percentile)) if gaps else None

    def prompt_templates(self) -> dict[str, AgentTemplate]:
        """Per agent: the dominant prompt-composition template and its support (templates.py)."""
        return dict(self.templates.templates())

    def gap_after(self, agent_id: str) -> Summary | None:
        summary = self._tables().summaries.get(agent_id)
        return summary.gap_after_s if summary is not None else None

    # ---------------------------------------------------------------------------- persistence

    def to_state(self) -> dict[str, Any]:
        """Everything as plain dicts, lists, strings and numbers (JSON-safe)."""
        return {
            "tenant": self.tenant,
            "workflow_type_id": self.workflow_type_id,
            "config": asdict(self.config),
            "open": {
                w: {
                    "calls": [_call_state(c) for c in o.calls.values()],
                    "last_activity": o.last_activity,
                    "chains": None if o.chains is None else o.chains.to_state(),
                }
                for w, o in self._open.items()
            },
            "seen": list(self._seen),
            "closed_ids": list(self._closed_ids),
            "old_versions": sorted(self._old_versions),
            "confidence": self.confidence.to_state(),
            "traces": [[list(s.agents) for s in t] for t in self.traces],
            "automaton": self.automaton.to_state(),
            "agents": {a: s.to_state() for a, s in self.agents.items()},
            "steps_per_instance": list(self.steps_per_instance),
            "duration_s": list(self.duration_s),
            "steps_convergence": self.steps_convergence.to_state(),
            "duration_convergence": self.duration_convergence.to_state(),
            "tool_gaps": {t: list(g) for t, g in self.tool_gaps.items()},
            "instances": self.instances,
            "since_synthesis": self.since_synthesis,
            "templates": self.templates.to_state(),
            "model": None
            if self.model is None
            else {
                "expr": to_text(self.model.expr),
                "weights": self.model.weights,
                "acceptance": self.acceptance,
                "structured": self.structured,
            },
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> WorkflowProfile:
        raw = dict(state["config"])
        raw["synthesis"] = SynthesisConfig(**raw["synthesis"])
        raw["confidence"] = ConfidenceConfig(**raw["confidence"])
        raw["templates"] = TemplateConfig(**raw.get("templates", {}))
        profile = cls(state["tenant"], state["workflow_type_id"], ProfileConfig(**raw))
        for w, o in state["open"].items():
            instance = _Open(last_activity=float(o["last_activity"]))
            for c in o["calls"]:
                instance.add(Call(**{**c, "parent_request_ids": tuple(c["parent_request_ids"])}))
            if o.get("chains") is not None:
                instance.chains = ChainStore.from_state(o["chains"], profile.config.templates)
            profile._open[w] = instance
        profile._seen = OrderedDict((k, None) for k in state["seen"])
        profile._closed_ids = OrderedDict((k, None) for k in state["closed_ids"])
        profile._old_versions = set(state["old_versions"])
        profile.confidence = ConfidenceState.from_state(state["confidence"])
        profile.traces.extend(tuple(Step(tuple(s)) for s in t) for t in state["traces"])
        profile.automaton = TransitionAutomaton.from_state(state["automaton"])
        profile.agents = {a: AgentStats.from_state(s) for a, s in state["agents"].items()}
        profile.steps_per_instance.extend(state["steps_per_instance"])
        profile.duration_s.extend(state["duration_s"])
        profile.steps_convergence = ConvergenceTracker.from_state(state["steps_convergence"])
        profile.duration_convergence = ConvergenceTracker.from_state(state["duration_convergence"])
        profile.tool_gaps = {t: deque(g, maxlen=4096) for t, g in state["tool_gaps"].items()}
        profile.instances = int(state["instances"])
        profile.since_synthesis = int(state["since_synthesis"])
        if "templates" in state:
            profile.templates = TemplateLearner.from_state(state["templates"], profile.config.templates)
        if state["model"] is not None:
            m = state["model"]
            profile.model = PathModel(parse(m["expr"]), m["weights"])
            profile.acceptance = m["acceptance"]
            profile.structured = bool(m["structured"])
            profile._model_id = 1
        return profile


def _call_state(call: Call) -> dict[str, Any]:
    data = asdict(call)
    data["parent_request_ids"] = list(call.parent_request_ids)
    return data


class ProfileStore:
    """The profiles of all (tenant, workflow type) pairs; unknown pairs annotate as confidence NONE."""

    def __init__(self, config: ProfileConfig | None = None) -> None:
        self.config = config or ProfileConfig()
        self.profiles: dict[tuple[str, str], WorkflowProfile] = {}

    def profile(self, tenant: str, workflow_type_id: str) -> WorkflowProfile:
        key = (tenant, workflow_type_id)
        if key not in self.profiles:
            self.profiles[key] = WorkflowProfile(tenant, workflow_type_id, self.config)
        return self.profiles[key]

    def ingest(self, tenant: str, workflow_type_id: str, record: CallRecord) -> IngestResult:
        return self.profile(tenant, workflow_type_id).ingest(record)

    def tick(self, now: float) -> tuple[WorkflowTrace, ...]:
        return tuple(t for p in self.profiles.values() for t in p.tick(now))

    def annotate(self, tenant: str, workflow_type_id: str, agent_id: str, **kwargs: Any) -> Annotation:
        profile = self.profiles.get((tenant, workflow_type_id))
        return profile.annotate(agent_id, **kwargs) if profile is not None else Annotation.empty()
