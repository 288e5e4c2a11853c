"""Prequential replay: feed every call through a WorkflowProfile as the live service would, and score
the predictions made for the held-out workflows before each of their calls ran.

    time ->  call starts: annotate(agent, workflow)   call ends: ingest(record)
             (held-out calls only: a prediction)      (every call; the last one closes the instance)

The first ``1 - holdout`` of the workflows (in order) only teach; the rest are scored while the
profile keeps learning from them as they close, as it would live (a held-out call is predicted
before its own record, and its instance's later records, arrive).  At equal times records are
ingested before annotations: a call that ends at t is visible to one that starts at t.

Metrics (fractions in [0, 1]):
* ``length_interval_coverage`` — held-out calls whose output length is at most the annotated p99
  bound (a call with no bound counts as not covered); ``length_interval_width_ratio`` — the median
  of bound / actual length over the calls that had a bound.
* ``path_acceptance`` — held-out workflows the path expression current when they closed accepts.
* ``next_agent_top1`` — held-out calls whose most likely next step (an agent, or the end) is what
  followed the call's step in the reconstructed trace (no prediction counts as wrong).
* ``remaining_steps_mae`` — mean |predicted - actual| steps after the call's step, over the calls
  with a prediction (``remaining_steps_predicted`` says how many had one).
* ``priority_ordering_accuracy`` — Kairos §7.4: at each held-out request's arrival, it is paired
  with every held-out request of another workflow still in flight; a pair is ordered correctly
  when the request whose workflow ends sooner has the smaller predicted end (its start + its
  agent's mean service time + the expected remaining time).  Per-request accuracies are averaged;
  pairs without a prediction or with equal predictions count one half (FCFS is 0.5), pairs whose
  workflows end together are skipped.  ``..._kairos_rank`` orders by the agent rank instead.
* ``workflows_to_converge`` — closed instances when ``WorkflowProfile.converged()`` first held.
* ``annotate_p50_ms``, ``annotate_p99_ms``, ``ingest_records_per_s`` — in process, wall clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clairvoyant.profiler.core.confidence import Tier
from clairvoyant.profiler.core.profile import Annotation, CallRecord, ProfileConfig, WorkflowProfile
from clairvoyant.profiler.core.trace import build_trace
from clairvoyant.profiler.evaluation.data import Workflow

END = "$"


@dataclass
class _Prediction:
    workflow: int
    start: float
    predicted_end: float | None
    rank: int | None


@dataclass
class _Scores:
    covered: list[bool] = field(default_factory=list)
    width: list[float] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    next_hit: list[bool] = field(default_factory=list)
    remaining_error: list[float] = field(default_factory=list)
    order_time: list[float] = field(default_factory=list)
    order_rank: list[float] = field(default_factory=list)
    annotate_s: list[float] = field(default_factory=list)
    ingest_s: float = 0.0
    records: int = 0
    converged_at: int | None = None
    active_at: int | None = None


def _pair_accuracy(
    me: _Prediction, others: Sequence[_Prediction], ends: Sequence[float], key: Callable[[_Prediction], Any]
) -> float | None:
    score, pairs = 0.0, 0
    for other in others:
        truth = ends[me.workflow] - ends[other.workflow]
        if truth == 0:
            continue
        pairs += 1
        a, b = key(me), key(other)
        if a is None or b is None or a == b:
            score += 0.5
        elif (a < b) == (truth < 0):
            score += 1.0
    return score / pairs if pairs else None


def _next_truth(workflow: Workflow) -> dict[str, tuple[frozenset[str], int]]:
    """request id -> (agents of the next step or {END}, steps after the call's step)."""
    trace = build_trace(workflow.workflow_id, (r.call() for r in workflow.records))
    truth: dict[str, tuple[frozenset[str], int]] = {}
    for i, group in enumerate(trace.calls):
        nxt = frozenset(trace.steps[i + 1].agents) if i + 1 < len(trace.steps) else frozenset((END,))
        for call in group:
            truth[call.request_id] = (nxt, len(trace.steps) - i - 1)
    return truth


def _top1(annotation: Annotation) -> str | None:
    if annotation.end_probability is None:
        return None
    top = annotation.next_agents[0] if annotation.next_agents else (END, 0.0)
    return END if annotation.end_probability >= top[1] else top[0]


def replay(
    workflows: Sequence[Workflow],
    holdout: float,
    config: ProfileConfig | None = None,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run the replay and return the report (module doc).  ``progress`` gets the events done."""
    if not 0.0 < holdout < 1.0:
        raise ValueError(f"holdout must be in (0, 1), got {holdout}")
    profile = WorkflowProfile("evaluation", "evaluation", config)
    first_test = int(round(len(workflows) * (1.0 - holdout)))
    ends = [w.end for w in workflows]
    # (time, 0 ingest / 1 annotate, workflow, closing record last, index)
    events: list[tuple[float, int, int, int, int]] = []
    for w, workflow in enumerate(workflows):
        for i, r in enumerate(workflow.records):
            events.append((r.end, 0, w, int(r.workflow_end), i))
            if w >= first_test:
                events.append((r.start, 1, w, 0, i))
    events.sort()
    truths: dict[int, dict[str, tuple[frozenset[str], int]]] = {}
    scores = _Scores()
    in_flight: dict[str, _Prediction] = {}
    for done, (_, kind, w, _, i) in enumerate(events):
        record: CallRecord = workflows[w].records[i]
        if kind == 0:
            model_before = profile.model
            started = time.perf_counter()
            result = profile.ingest(record)
            scores.ingest_s += time.perf_counter() - started
            scores.records += 1
            in_flight.pop(record.request_id, None)
            for trace in result.closed:
                if w >= first_test:
                    scores.accepted.append(model_before is not None and model_before.accepts(trace.steps))
                if scores.converged_at is None and profile.converged():
                    scores.converged_at = profile.instances
                if scores.active_at is None and profile.confidence.tier is not Tier.SHADOW:
                    scores.active_at = profile.instances
        else:
            started = time.perf_counter()
            annotation = profile.annotate(record.agent_id, record.workflow_id)
            scores.annotate_s.append(time.perf_counter() - started)
            _score_call(profile, record, annotation, truths, workflows, w, scores, in_flight, ends)
        if progress is not None and done % 1000 == 0:
            progress(done)
    if progress is not None:
        progress(len(events))
    return _report(profile, scores, first_test, len(workflows))


def _score_call(
    profile: WorkflowProfile,
    record: CallRecord,
    annotation: Annotation,
    truths: dict[int, dict[str, tuple[frozenset[str], int]]],
    workflows: Sequence[Workflow],
    w: int,
    scores: _Scores,
    in_flight: dict[str, _Prediction],
    ends: Sequence[float],
) -> None:
    p99 = annotation.output_len_p99
    scores.covered.append(p99 is not None and record.output_tokens <= p99)
    if p99 is not None:
        scores.width.append(p99 / max(record.output_tokens, 1))
    if w not in truths:
        truths[w] = _next_truth(workflows[w])
    following, remaining = truths[w][record.request_id]
    scores.next_hit.append(_top1(annotation) in following)
    if annotation.expected_remaining_steps is not None:
        scores.remaining_error.append(abs(annotation.expected_remaining_steps - remaining))
    predicted_end = None
    if annotation.expected_remaining_time_s is not None:
        summary = profile.agent_summaries().get(record.agent_id)
        service = summary.service_s.mean if summary is not None and summary.service_s is not None else 0.0
        predicted_end = record.start + service + annotation.expected_remaining_time_s
    me = _Prediction(w, record.start, predicted_end, annotation.kairos_rank)
    others = [p for p in in_flight.values() if p.workflow != w]
    by_time = _pair_accuracy(me, others, ends, lambda p: p.predicted_end)
    if by_time is not None:
        scores.order_time.append(by_time)
        by_rank = _pair_accuracy(me, others, ends, lambda p: p.rank)
        assert by_rank is not None
        scores.order_rank.append(by_rank)
    in_flight[record.request_id] = me


def _mean(values: Sequence[float] | Sequence[bool]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _report(profile: WorkflowProfile, s: _Scores, first_test: int, total: int) -> dict[str, Any]:
    annotate_ms = np.asarray(s.annotate_s) * 1e3
    return {
        "workflows_train": first_test,
        "workflows_test": total - first_test,
        "calls_test": len(s.covered),
        "length_interval_coverage": _mean(s.covered),
        "length_interval_width_ratio": float(np.median(s.width)) if s.width else None,
        "path_acceptance": _mean(s.accepted),
        "next_agent_top1": _mean(s.next_hit),
        "remaining_steps_mae": _mean(s.remaining_error),
        "remaining_steps_predicted": len(s.remaining_error) / len(s.covered) if s.covered else None,
        "priority_ordering_accuracy": _mean(s.order_time),
        "priority_ordering_accuracy_kairos_rank": _mean(s.order_rank),
        "priority_requests": len(s.order_time),
        "workflows_to_converge": s.converged_at,
        "workflows_to_active": s.active_at,
        "annotate_p50_ms": float(np.percentile(annotate_ms, 50)) if len(annotate_ms) else None,
        "annotate_p99_ms": float(np.percentile(annotate_ms, 99)) if len(annotate_ms) else None,
        "ingest_records_per_s": s.records / s.ingest_s if s.ingest_s > 0 else None,
        "agents": len(profile.agents),
        "tier": profile.confidence.tier.value,
        "structured": profile.structured,
        "expression": profile.expression,
        "templates": {a: t.template for a, t in profile.prompt_templates().items()},
    }
