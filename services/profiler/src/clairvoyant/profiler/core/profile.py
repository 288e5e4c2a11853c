"""WorkflowProfile: everything the profiler knows about one (tenant, workflow type), in memory.

``ingest(record)`` is idempotent on request id and never raises on a well-formed record: a record
for an instance already closed is LATE (not counted), one of a workflow version seen before that is
not the current one is STALE (dropped), and a new version resets the profile to a fresh SHADOW
profile.  An instance closes on its end marker (``workflow_end``) or after ``idle_timeout_s``
without activity (``tick(now)``; times are passed in, never read); each closed instance is learned
from (trace, transition automaton, workload statistics, confidence, prompt templates) and the path
expression is re-synthesised every ``resynthesize_every`` closed instances.  ``annotate`` answers
from tables rebuilt on the ingestion path (``refresh_tables``): in SHADOW only the output-length
interval, in LOW and HIGH the structure too.  ``to_state``/``from_state`` round-trip through
plain, JSON-safe dicts.  The design and its trade-offs: docs/profiler.md, "Workflow profiles".
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from clairvoyant.profiler.core.agent_names import AgentNames
from clairvoyant.profiler.core.automaton import TransitionAutomaton
from clairvoyant.profiler.core.confidence import (
    ConfidenceState,
    Tier,
    on_instance,
    on_synthesized,
    on_version,
)
from clairvoyant.profiler.core.expr import parse, to_text
from clairvoyant.profiler.core.open_instance import OpenInstance
from clairvoyant.profiler.core.path_fitting import DerivationCache
from clairvoyant.profiler.core.paths import PathModel, Position, compile_expr
from clairvoyant.profiler.core.prediction import AnnotationTables, positions_after, predict_structure
from clairvoyant.profiler.core.priors import LengthPriors
from clairvoyant.profiler.core.profile_types import (
    Annotation,
    CallRecord,
    IngestResult,
    IngestStatus,
    ProfileConfig,
    StructurePrediction,
)
from clairvoyant.profiler.core.ranking import AgentRanking
from clairvoyant.profiler.core.remaining import ProgressTracker, RemainingModel, RemainingPrediction
from clairvoyant.profiler.core.stats import AgentSummary, ConvergenceTracker, LearnedAgentStats, Summary
from clairvoyant.profiler.core.synthesis import synthesize
from clairvoyant.profiler.core.templates import AgentTemplate, ChainStore, TemplateLearner
from clairvoyant.profiler.core.trace import Step, StepLike, WorkflowTrace, as_steps
from clairvoyant.profiler.core.workload_stats import LearnedWorkloadStats

SCORE_EVERY = 2  # closed instances between scorings of the remaining-time predictors


class WorkflowProfile:
    def __init__(self, tenant: str, workflow_type_id: str, config: ProfileConfig | None = None) -> None:
        self.tenant = tenant
        self.workflow_type_id = workflow_type_id
        self.config = config or ProfileConfig()
        self._open: dict[str, OpenInstance] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._closed_ids: OrderedDict[str, None] = OrderedDict()
        self._old_versions: set[str] = set()
        self.confidence = ConfidenceState()
        self.names = AgentNames(self.config.agent_names)
        self._reset_learning()

    def _reset_learning(self) -> None:
        self.traces: deque[tuple[Step, ...]] = deque(maxlen=self.config.max_traces)
        self.automaton = TransitionAutomaton()
        self.stats = LearnedWorkloadStats(self.config.max_traces)
        self.instances = 0
        self.since_synthesis = 0
        self.since_tables = 0
        self.model: PathModel | None = None
        self.acceptance: float | None = None
        self.structured: bool = False
        # whether the structured expression of the day accepted each workflow that closed after it
        # was synthesised, before learning from it; the one passed over for the generic loop
        # (``_candidate``) is still scored, so a structure that starts to generalise comes back
        window = self.config.synthesis.generalization_window
        self.generalization: deque[bool] = deque(maxlen=window)
        self._candidate: PathModel | None = None
        self._model_id = 0
        self._tables: AnnotationTables | None = None
        self.templates = TemplateLearner(self.config.templates)
        self.priors = LengthPriors(self.config.priors)
        self.remaining = RemainingModel(self.config.remaining)
        # derivations kept across re-learnings, per profile (path_fitting.py)
        self._derivations = DerivationCache(max_expressions=2, max_shapes=2 * self.config.max_traces)
        self.path_errors: deque[float] = deque(maxlen=self.config.remaining.residual_window)
        self.work_errors: deque[float] = deque(maxlen=self.config.remaining.residual_window)

    @property
    def agents(self) -> dict[str, LearnedAgentStats]:
        return self.stats.agents

    @property
    def steps_convergence(self) -> ConvergenceTracker:
        return self.stats.steps_convergence

    @property
    def duration_convergence(self) -> ConvergenceTracker:
        return self.stats.duration_convergence

    # ----------------------------------------------------------------------------- ingestion

    def ingest(self, record: CallRecord) -> IngestResult:
        if record.request_id in self._seen:
            return IngestResult(IngestStatus.DUPLICATE)
        if record.workflow_version is not None and record.workflow_version in self._old_versions:
            return IngestResult(IngestStatus.STALE)
        self._remember(self._seen, record.request_id, self.config.max_seen_ids)
        reset = False
        previous_version = self.confidence.version
        self.confidence, reset = on_version(self.confidence, record.workflow_version)
        if reset:
            if previous_version is not None:
                self._old_versions.add(previous_version)
            self._open.clear()
            self._reset_learning()
        if record.workflow_id in self._closed_ids:
            return IngestResult(IngestStatus.LATE, reset=reset)
        record = self.names.normalized(record)
        self.priors.note_model(record.agent_id, record.model)
        instance = self._open.setdefault(record.workflow_id, OpenInstance())
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
        positions = instance.positions(self.model, self._model_id) if self.model is not None else None
        self._learn(trace, positions)
        if instance.chains is not None:
            self.templates.learn(instance.chains.calls())
        return trace

    def _learn(self, trace: WorkflowTrace, positions: Sequence[Position] | None = None) -> None:
        self.instances += 1
        self.since_synthesis += 1
        self.traces.append(trace.steps)
        self.automaton.add(trace.steps)
        # Every SCORE_EVERY-th instance scores the two remaining-time predictors (costing the path
        # model's state values takes ~1 ms), before the statistics learn from it.
        scored = self.instances % SCORE_EVERY == 0
        path_errors = self._path_errors(trace, positions) if scored else []
        self.stats.observe(trace, self.instances)
        self.priors.observe(trace)
        work_errors = self.remaining.observe(trace)
        if scored and path_errors and work_errors:  # only instances both predicted: like is compared with like
            self.path_errors.extend(path_errors)
            self.work_errors.extend(work_errors)
        accepted = self.model.accepts(trace.steps) if self.model is not None else None
        if self.model is not None and self.structured:
            self.generalization.append(bool(accepted))
        elif self._candidate is not None:
            self.generalization.append(self._candidate.accepts(trace.steps))
        # Every resynthesize_every instances, stretched to an eighth of those seen once there are
        # many: a synthesis over the 500-trace window costs ~100 ms.
        every = max(self.config.resynthesize_every, self.instances // 8)
        # ... and at once when the evidence turns against the kind of expression served
        turned = (self.structured and not self.generalizes) or (self._candidate is not None and self.generalizes)
        if self.model is None or self.since_synthesis >= every or turned:
            self.resynthesize()
        self.confidence = on_instance(self.confidence, accepted, self.converged(), self.config.confidence)
        self.since_tables += 1
        if self._tables is None or self.since_tables >= self.config.tables_every:
            self.refresh_tables()

    def _path_errors(self, trace: WorkflowTrace, positions: Sequence[Position] | None) -> list[float]:
        """The path model's held-out errors on a closed instance, |log(1 + predicted) - log(1 +
        actual)| per call, from the positions after each step (``positions``) and the agents'
        mean service times and gaps before it (computed here, not from the annotation tables, so
        that a profile's state never depends on when its tables were rebuilt).  The remaining-work
        model scores itself the same way as it learns; ``remaining_time_source`` compares them."""
        if positions is None or self.model is None or len(positions) != len(trace.calls) + 1:
            return []
        service = {a: float(np.mean(s.service_s)) for a, s in self.agents.items() if s.service_s}
        gaps = {a: float(np.mean(s.gap_after_s)) for a, s in self.agents.items() if s.gap_after_s}
        if not service:
            return []
        time_values = self.model.time_values(service, gaps)
        end, errors = trace.end, []
        for i, group in enumerate(trace.calls):
            after = self.model.expected_remaining(positions[i + 1], time_values=time_values).time_s or 0.0
            for call in group:
                # the path model's time starts at the next step: add the agent's mean gap before it
                predicted = after + gaps.get(call.agent_id, 0.0) if i + 1 < len(trace.calls) or after > 0 else 0.0
                errors.append(abs(math.log1p(max(predicted, 0.0)) - math.log1p(max(end - call.end, 0.0))))
        return errors

    @property
    def remaining_time_source(self) -> str:
        """``"work"`` (remaining.py) or ``"path"``: the remaining-time predictor with the lower mean
        held-out log error over the recent instances both predicted (``_path_errors``)."""
        if not self.work_errors or not self.path_errors:
            return "path"
        work = sum(self.work_errors) / len(self.work_errors)
        path = sum(self.path_errors) / len(self.path_errors)
        return "work" if work < path else "path"

    @property
    def generalizes(self) -> bool:
        """Whether structured expressions accept the workflows that close after them.  A structure
        learned from few, irregular traces can accept 90% of them and half of the next ones
        (ChatDev's optional test phase and varying openings); the generic loop over every agent
        then predicts better, and its first-order transitions keep the next-agent predictions.

        With fewer than ``generalization_min`` scored, yes.  A served structure is passed over
        when even the upper end of the one-sided 95% Wilson interval of its acceptance over the
        last ``generalization_window`` is below ``min_acceptance``, so that acceptance hovering
        near the threshold (27 to 31 of 32 on sub-agent sessions) does not flip it; the candidate
        comes back once its acceptance itself reaches ``min_acceptance``."""
        config = self.config.synthesis
        seen = len(self.generalization)
        if seen < config.generalization_min:
            return True
        rate = sum(self.generalization) / seen
        if self._candidate is not None:  # the generic loop is served: come back on the estimate
            return rate >= config.min_acceptance
        z2 = 1.645**2
        centre = rate + z2 / (2 * seen)
        spread = 1.645 * math.sqrt(rate * (1 - rate) / seen + z2 / (4 * seen * seen))
        return (centre + spread) / (1 + z2 / seen) >= config.min_acceptance

    def resynthesize(self) -> None:
        if not self.traces:
            return
        result = synthesize(
            list(self.traces), None, self.config.synthesis, cache=self._derivations, generalizes=self.generalizes
        )
        self._candidate = compile_expr(result.candidate) if result.candidate is not None else None
        if self.model is not None and result.structured != self.structured:
            # the path model's errors so far describe the other kind of expression
            self.path_errors.clear()
            self.work_errors.clear()
        self.model = PathModel(result.expr, result.weights)
        self.acceptance = result.acceptance
        self.structured = result.structured
        self.since_synthesis = 0
        self._model_id += 1
        self.confidence = on_synthesized(self.confidence, result.acceptance)
        self._tables = None

    def converged(self) -> bool:
        """Kairos §4.3's convergence test (``LearnedWorkloadStats.converged``)."""
        return self.stats.converged()

    # ---------------------------------------------------------------------------- prediction

    def refresh_tables(self) -> None:
        """Rebuild the annotation tables now (per-agent summaries, Kairos rank, time values)."""
        self._tables = None
        self.since_tables = 0
        self._annotation_tables()

    def _annotation_tables(self) -> AnnotationTables:
        if self._tables is None:
            self._tables = AnnotationTables.build(self.stats.agents, self.model)
        return self._tables

    def annotate(
        self,
        agent_id: str,
        workflow_id: str | None = None,
        prompt_tokens: int | None = None,
        history: Sequence[StepLike] | None = None,
        now: float | None = None,
        model: str | None = None,
    ) -> Annotation:
        """Predictions for a request of ``agent_id`` arriving at ``now`` (on the records' clock;
        default: the instance's latest activity).  The position is ``history`` (steps already
        taken, when given) or what was ingested so far for ``workflow_id``; the remaining time and
        its Gittins index come from the remaining-work model (remaining.py) once it has learned,
        else from the path model.  ``prompt_tokens`` is the request's context, which the
        remaining-work model reads; ``model``, the model it will run on, picks the length prior of
        an agent never seen (priors.py)."""
        agent_id = self.names.lookup(agent_id)  # a name never ingested keeps its own (agent_names.py)
        if not self._seen:
            return Annotation.empty()  # never heard of: the reactive tier
        tables = self._annotation_tables()
        instance = self._open.get(workflow_id) if workflow_id is not None else None
        previous_len = None
        if instance is not None:
            latest = instance.last_by_agent.get(agent_id)
            if latest is not None:
                previous_len = float(latest.output_tokens)
        summary = tables.summaries.get(agent_id)
        taken: Sequence[Step] | None = as_steps(history) if history is not None else None
        if taken is None and workflow_id is not None:  # an instance not open yet is at its first step
            taken = instance.trace.steps if instance is not None else ()
        interval = self.priors.length_interval(agent_id, summary, previous_len, taken, model)  # priors.py
        p50, p99 = interval if interval is not None else (None, None)
        tier = self.confidence.tier
        if tier is Tier.SHADOW or self.model is None:
            return Annotation(Tier.SHADOW, p50, p99)
        predicted = self.predict(agent_id, workflow_id, history)
        assert predicted is not None
        position, nxt, remaining = predicted
        projection = self.model.project_steps(position, self.config.projection_steps)
        work = self.predict_remaining(agent_id, workflow_id, prompt_tokens or 0, now)
        time_s = work.mean_s if work is not None and self.remaining_time_source == "work" else remaining.time_s
        return Annotation(
            tier,
            p50,
            p99,
            self.model.residual(position, self.config.residual_min_share),
            remaining.steps if time_s is remaining.time_s or work is None else work.steps,
            time_s,
            nxt.agents,
            nxt.end_probability,
            tables.ranking.rank.get(agent_id),
            position.on_path,
            self.templates.template(nxt.agents[0][0]) if nxt.agents else "",
            tuple(tuple((agent, n) for agent, n in step.items() if n > 0.0) for step in projection),
            None if work is None else work.gittins,
        )

    def predict(
        self, agent_id: str, workflow_id: str | None = None, history: Sequence[StepLike] | None = None
    ) -> StructurePrediction | None:
        """The structure predictions for a request of ``agent_id`` whatever the tier (``annotate``
        serves them only in LOW and HIGH); None before the first expression exists."""
        if self.model is None:
            return None
        tables = self._annotation_tables()
        instance = self._open.get(workflow_id) if workflow_id is not None else None
        steps: Sequence[Step]
        if history is not None:
            steps = as_steps(history)
            positions = positions_after(self.model, steps)
        elif instance is not None:
            positions = instance.positions(self.model, self._model_id)
            steps = instance.trace.steps
        else:
            steps, positions = (), [self.model.start_position()]
        return predict_structure(self.model, tables, agent_id, steps, positions)

    def predict_remaining(
        self, agent_id: str, workflow_id: str | None = None, prompt_tokens: int = 0, now: float | None = None
    ) -> RemainingPrediction | None:
        """The remaining-work model's prediction (remaining.py) for a call of ``agent_id`` starting
        at ``now`` (default: the instance's latest activity), whatever the tier; None before it has
        learned ``min_instances`` instances."""
        instance = self._open.get(workflow_id) if workflow_id is not None else None
        if instance is None:
            progress = ProgressTracker().progress(agent_id, 0.0, prompt_tokens, 0.0)
        else:
            progress = instance.progress(agent_id, now, prompt_tokens)
        return self.remaining.predict(progress)

    # ---------------------------------------------------------------------------- inspection

    @property
    def expression(self) -> str:
        return to_text(self.model.expr) if self.model is not None else ""

    def agent_summaries(self) -> dict[str, AgentSummary]:
        return dict(self._annotation_tables().summaries)

    def ranking(self) -> AgentRanking:
        return self._annotation_tables().ranking

    def tool_ttl_s(self, tool: str, percentile: float = 95.0) -> float | None:
        """SAGA's tool-call TTL: the percentile of the gap observed before calls after ``tool``."""
        return self.stats.tool_ttl_s(tool, percentile)

    def prompt_templates(self) -> dict[str, AgentTemplate]:
        """Per agent: the dominant prompt-composition template and its support (templates.py)."""
        return dict(self.templates.templates())

    def gap_after(self, agent_id: str) -> Summary | None:
        summary = self._annotation_tables().summaries.get(agent_id)
        return summary.gap_after_s if summary is not None else None

    # ---------------------------------------------------------------------------- persistence

    def to_state(self) -> dict[str, Any]:
        """Everything as plain dicts, lists, strings and numbers (JSON-safe)."""
        return {
            "tenant": self.tenant,
            "workflow_type_id": self.workflow_type_id,
            "config": asdict(self.config),
            "open": {w: o.to_state() for w, o in self._open.items()},
            "seen": list(self._seen),
            "closed_ids": list(self._closed_ids),
            "old_versions": sorted(self._old_versions),
            "confidence": self.confidence.to_state(),
            "traces": [[list(s.agents) for s in t] for t in self.traces],
            "automaton": self.automaton.to_state(),
            **self.stats.to_state(),  # agents ... tool_gaps, inline
            "instances": self.instances,
            "since_synthesis": self.since_synthesis,
            "templates": self.templates.to_state(),
            "remaining": self.remaining.to_state(),
            "remaining_errors": {"path": list(self.path_errors), "work": list(self.work_errors)},
            "generalization": {
                "accepted": list(self.generalization),
                "candidate": None if self._candidate is None else to_text(self._candidate.expr),
            },
            "agent_names": self.names.to_state(),
            "priors": self.priors.to_state(),
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
        profile = cls(state["tenant"], state["workflow_type_id"], ProfileConfig.from_state(state["config"]))
        for w, o in state["open"].items():
            profile._open[w] = OpenInstance.from_state(o, profile.config.templates)
        profile._seen = OrderedDict((k, None) for k in state["seen"])
        profile._closed_ids = OrderedDict((k, None) for k in state["closed_ids"])
        profile._old_versions = set(state["old_versions"])
        profile.confidence = ConfidenceState.from_state(state["confidence"])
        profile.traces.extend(tuple(Step(tuple(s)) for s in t) for t in state["traces"])
        profile.automaton = TransitionAutomaton.from_state(state["automaton"])
        profile.stats = LearnedWorkloadStats.from_state(state, profile.config.max_traces)
        profile.instances = int(state["instances"])
        profile.since_synthesis = int(state["since_synthesis"])
        if "templates" in state:
            profile.templates = TemplateLearner.from_state(state["templates"], profile.config.templates)
        if "remaining" in state:  # states saved before the remaining-work model learn it afresh
            profile.remaining = RemainingModel.from_state(state["remaining"], profile.config.remaining)
            profile.path_errors.extend(state["remaining_errors"]["path"])
            profile.work_errors.extend(state["remaining_errors"]["work"])
        if "generalization" in state:  # states saved before the check start with no evidence
            profile.generalization.extend(bool(a) for a in state["generalization"]["accepted"])
            candidate = state["generalization"]["candidate"]
            profile._candidate = None if candidate is None else compile_expr(parse(candidate))
        profile.names = AgentNames.from_state(state.get("agent_names", {}), profile.config.agent_names)
        profile.priors = LengthPriors.from_state(state.get("priors", {}), profile.config.priors)
        if state["model"] is not None:
            m = state["model"]
            profile.model = PathModel(parse(m["expr"]), m["weights"])
            profile.acceptance = m["acceptance"]
            profile.structured = bool(m["structured"])
            profile._model_id = 1
        return profile
