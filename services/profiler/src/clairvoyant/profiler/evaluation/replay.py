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
* ``priority_ordering_accuracy`` — Kairos §7.4 ("request-level sorting accuracy"): when a held-out
  request arrives, it is paired with every held-out request of another workflow still in flight;
  the quantity ordered is the remaining latency to the end of the request's workflow (both are
  compared at the same moment, so the workflow that ends sooner must get the higher priority).
  Per-request accuracies (correct pairs / pairs) are averaged over requests.  A pair with no
  prediction on either side, or equal predictions, counts one half (FCFS scores 0.5: either may
  run first); pairs whose workflows end at the same instant have no right order and are skipped.
  Served predictions only: in SHADOW nothing is served and every pair counts one half.  The
  headline orders by the served predicted end (``start`` + the agent's mean service time + the
  annotation's ``expected_remaining_time_s``).
* ``priority_predictors`` — the same accuracy for other orders, each computed from the profile's
  statistics whether or not the tier serves them (a diagnosis, not what is served):
  ``kairos`` — Kairos §5's scheduler order: the agent rank, then the earlier application-level
  (workflow) start; ``agent_mean`` — start + the mean remaining latency of the request's agent
  (the quantity the Kairos rank is built from, without the MDS); ``workflow_start`` — the earlier
  workflow start first; ``path`` — the served predictor, ungated; ``oracle_path`` — the true
  remaining steps, each costed at its agents' mean service time + gap (what a perfect structure
  model with mean timings would say: the ceiling for any predictor built from mean times);
  ``remaining_mean`` / ``remaining_median`` — start + service + the remaining-work model's
  (core/remaining.py) mean / median remaining time, from the request's progress;
  ``remaining_gittins`` — its Gittins index, highest first; ``remaining_steps`` — its expected
  remaining steps, fewest first.  The served order uses the annotation's remaining time, which is
  the remaining-work model's or the path model's, whichever the profile scores better.  Each
  also with ``_cross_agent``: pairs of requests of different agents only (a literal reading of
  §7.4's "all other agent requests"; same-agent pairs are the ones an agent-level rank cannot
  separate).
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
from clairvoyant.profiler.core.trace import Step, build_trace
from clairvoyant.profiler.evaluation.data import Workflow

END = "$"


PREDICTORS = (
    "path",
    "kairos",
    "agent_mean",
    "workflow_start",
    "oracle_path",
    "remaining_mean",
    "remaining_median",
    "remaining_gittins",
    "remaining_steps",
)


@dataclass
class _Prediction:
    workflow: int
    agent: str
    served: float | None  # the served predicted end (None: nothing served)
    keys: dict[str, Any]  # predictor name -> its sort key (smaller = ends sooner), None if unknown


@dataclass
class _Scores:
    covered: list[bool] = field(default_factory=list)
    width: list[float] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    next_hit: list[bool] = field(default_factory=list)
    remaining_error: list[float] = field(default_factory=list)
    order_served: list[float] = field(default_factory=list)
    order: dict[str, list[float]] = field(default_factory=dict)
    annotate_s: list[float] = field(default_factory=list)
    ingest_s: float = 0.0
    records: int = 0
    converged_at: int | None = None
    active_at: int | None = None


def _pair_accuracy(
    me: _Prediction,
    others: Sequence[_Prediction],
    ends: Sequence[float],
    key: Callable[[_Prediction], Any],
    cross_agent: bool = False,
) -> float | None:
    """The share of correctly ordered pairs of ``me`` with ``others`` (module doc)."""
    score, pairs = 0.0, 0
    for other in others:
        truth = ends[me.workflow] - ends[other.workflow]
        if truth == 0 or (cross_agent and other.agent == me.agent):
            continue
        pairs += 1
        a, b = key(me), key(other)
        if a is None or b is None or a == b:
            score += 0.5
        elif (a < b) == (truth < 0):
            score += 1.0
    return score / pairs if pairs else None


@dataclass(frozen=True, slots=True)
class _Truth:
    following: frozenset[str]  # agents of the next step, or {END}
    remaining: tuple[Step, ...]  # the steps after the call's step


def _truths(workflow: Workflow) -> dict[str, _Truth]:
    """request id -> what really followed its call."""
    trace = build_trace(workflow.workflow_id, (r.call() for r in workflow.records))
    truth: dict[str, _Truth] = {}
    for i, group in enumerate(trace.calls):
        nxt = frozenset(trace.steps[i + 1].agents) if i + 1 < len(trace.steps) else frozenset((END,))
        for call in group:
            truth[call.request_id] = _Truth(nxt, trace.steps[i + 1 :])
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
    truths: dict[int, dict[str, _Truth]] = {}
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
            annotation = profile.annotate(
                record.agent_id, record.workflow_id, record.prompt_tokens, now=record.start
            )
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
    truths: dict[int, dict[str, _Truth]],
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
        truths[w] = _truths(workflows[w])
    truth = truths[w][record.request_id]
    scores.next_hit.append(_top1(annotation) in truth.following)
    if annotation.expected_remaining_steps is not None:
        scores.remaining_error.append(abs(annotation.expected_remaining_steps - len(truth.remaining)))
    summaries = profile.agent_summaries()
    summary = summaries.get(record.agent_id)
    service = summary.service_s.mean if summary is not None and summary.service_s is not None else 0.0
    served = None
    if annotation.expected_remaining_time_s is not None:
        served = record.start + service + annotation.expected_remaining_time_s
    keys = _diagnostic_keys(profile, record, truth, service, summaries, workflows[w].records[0].start)
    me = _Prediction(w, record.agent_id, served, keys)
    others = [p for p in in_flight.values() if p.workflow != w]
    by_served = _pair_accuracy(me, others, ends, lambda p: p.served)
    if by_served is not None:
        scores.order_served.append(by_served)
        for name in PREDICTORS:
            for cross in (False, True):
                value = _pair_accuracy(me, others, ends, lambda p, n=name: p.keys[n], cross)  # type: ignore[misc]
                if value is not None:
                    scores.order.setdefault(name + ("_cross_agent" if cross else ""), []).append(value)
    in_flight[record.request_id] = me


def _diagnostic_keys(
    profile: WorkflowProfile,
    record: CallRecord,
    truth: _Truth,
    service: float,
    summaries: dict[str, Any],
    workflow_start: float,
) -> dict[str, Any]:
    """Sort keys of every predictor in PREDICTORS (module doc), from the profile's current state."""
    rank = profile.ranking().rank.get(record.agent_id)
    summary = summaries.get(record.agent_id)
    remaining = summary.remaining_s if summary is not None else None
    mean_remaining = remaining.mean if remaining is not None else None

    def cost(step: Step) -> float:
        def one(agent: str) -> float:
            s = summaries.get(agent)
            if s is None:
                return 0.0
            return (s.service_s.mean if s.service_s else 0.0) + (s.gap_after_s.mean if s.gap_after_s else 0.0)

        return max(one(a) for a in step.agents)

    prediction = profile.predict(record.agent_id, record.workflow_id)
    path = None if prediction is None else prediction.remaining.time_s
    own_gap = summary.gap_after_s.mean if summary is not None and summary.gap_after_s is not None else 0.0
    gap_now = own_gap if truth.remaining else 0.0
    aft = profile.predict_remaining(record.agent_id, record.workflow_id, record.prompt_tokens, record.start)
    return {
        "remaining_mean": None if aft is None else record.start + service + aft.mean_s,
        "remaining_median": None if aft is None else record.start + service + aft.median_s,
        "remaining_gittins": None if aft is None else -aft.gittins,
        "remaining_steps": None if aft is None else aft.steps,
        "path": None if path is None else record.start + service + path,
        "kairos": None if rank is None else (rank, workflow_start),
        "agent_mean": None if mean_remaining is None else record.start + mean_remaining,
        "workflow_start": workflow_start,
        "oracle_path": record.start + service + gap_now + sum(cost(s) for s in truth.remaining),
    }


def _mean(values: Sequence[float] | Sequence[bool]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


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
        "priority_ordering_accuracy": _mean(s.order_served),
        "priority_ordering_accuracy_kairos_rank": _mean(s.order.get("kairos", [])),
        "priority_requests": len(s.order_served),
        "priority_predictors": {name: _mean(values) for name, values in sorted(s.order.items())},
        # the served accuracy as a share of the mean-time oracle's (the ceiling, module doc)
        "priority_ordering_vs_oracle": _ratio(_mean(s.order_served), _mean(s.order.get("oracle_path", []))),
        "remaining_time_source": profile.remaining_time_source,
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
