"""Run metrics as the seeds define them, computed from ``RunRecords`` (simulated or live alike).

- JCT: a workflow's arrival to the end of its last call (and the tool after it).
- Program-level token latency (Autellix §6, Kairos §7): a workflow's JCT divided by the output
  tokens it generated, averaged over workflows.
- Distance from the limit: average JCT over the average critical-path lower bound.
- The limit (simulated runs): the capacity bound on the mean JCT and the critical paths together
  (sim/lower_bound.py), at least the larger of the two; ``avg_jct_over_limit``: average JCT over it.
- SLO attainment: the share of workflows whose JCT is within ``k`` times their own lower bound.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from clairvoyant.bench.records import KvTierTotals, RunRecords

SLO_MULTIPLES = (2.0, 5.0, 10.0)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(records: RunRecords) -> dict[str, Any]:
    done = [w for w in records.workflows if w.end_time is not None]
    jcts = [w.jct_s for w in done]
    bounds = [w.lower_bound_s for w in done]
    calls = [c for c in records.calls if c.end_time is not None and not c.rejected]
    rejected = sum(1 for c in records.calls if c.rejected)
    generated = sum(c.generated_tokens for c in calls)
    prompt = sum(c.prompt_tokens for c in calls)
    duration = records.duration_s or 1e-9
    tokens_by_workflow: dict[str, int] = defaultdict(int)
    for c in calls:
        tokens_by_workflow[c.workflow_id] += c.generated_tokens
    token_latency = [w.jct_s / max(1, tokens_by_workflow[w.workflow_id]) for w in done]
    ttft: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        if c.first_token_time is not None:
            ttft[c.agent_id].append(c.first_token_time - c.ready_time)
    queue: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        if c.start_time is not None:
            queue[c.model].append(c.queue_s)
    avg_jct = float(np.mean(jcts)) if jcts else 0.0
    avg_bound = float(np.mean(bounds)) if bounds else 0.0
    summary: dict[str, Any] = {
        "workflows": len(done),
        "calls": len(calls),
        "rejected_calls": rejected,  # refused by a replica (e.g. over the context window); not in "calls"
        "avg_jct_s": avg_jct,
        "p50_jct_s": _pct(jcts, 50),
        "p95_jct_s": _pct(jcts, 95),
        "p99_jct_s": _pct(jcts, 99),
        "throughput_tok_s": generated / duration,
        "workflows_per_min": len(done) / duration * 60.0,
        "avg_queue_s": float(np.mean([c.queue_s for c in calls if c.start_time is not None] or [0.0])),
        "queue_s_by_model": {m: float(np.mean(v)) for m, v in sorted(queue.items())},
        "ttft_s_by_agent": {a: float(np.mean(v)) for a, v in sorted(ttft.items())},
        "program_token_latency_s": float(np.mean(token_latency)) if token_latency else 0.0,
        "cache_hit_ratio": sum(c.cached_tokens for c in calls) / prompt if prompt else 0.0,
        # Prompt tokens served per tier.  Engines have one tier (GPU KV) until host and shared tiers
        # exist; a tier appears here once calls can hit it.
        "cache_hit_ratio_by_tier": {"gpu": sum(c.cached_tokens for c in calls) / prompt if prompt else 0.0},
        "preemptions": records.preemptions,
        "lower_bound_avg_jct_s": avg_bound,
        "distance_from_limit": avg_jct / avg_bound if avg_bound else 0.0,
        "slo_attainment": {
            f"{k:g}x": sum(j <= k * b for j, b in zip(jcts, bounds, strict=True)) / len(done) if done else 0.0
            for k in SLO_MULTIPLES
        },
        "duration_s": records.duration_s,
    }
    if records.capacity_bound_avg_jct_s is not None and records.limit_avg_jct_s is not None:
        summary["capacity_bound_avg_jct_s"] = records.capacity_bound_avg_jct_s
        summary["limit_avg_jct_s"] = limit = max(avg_bound, records.limit_avg_jct_s)
        summary["avg_jct_over_limit"] = avg_jct / limit if limit else 0.0
    if records.kv_tiers is not None:
        summary["kv_tiers"] = kv_tier_metrics(records.kv_tiers)
    return summary


def kv_tier_metrics(totals: KvTierTotals) -> dict[str, Any]:
    """The engines' hit ratio by tier (prompt tokens served from L1, L2, L3 over the prompt tokens
    they took), the prefill tokens saved and the tier traffic in blocks."""
    prompt = totals.prompt_tokens
    return {
        "hit_ratio": {f"l{tier}": hits / prompt if prompt else 0.0 for tier, hits in enumerate(totals.hit_tokens, 1)},
        "hit_tokens": {f"l{tier}": hits for tier, hits in enumerate(totals.hit_tokens, 1)},
        "prompt_tokens": prompt,
        "prefill_tokens_saved": totals.prefill_tokens_saved,
        "demoted_blocks": totals.demoted_blocks,
        "promoted_blocks": totals.promoted_blocks,
        "l3_written_blocks": totals.l3_written_blocks,
        "l3_fetched_blocks": totals.l3_fetched_blocks,
    }


def jct_list(records: RunRecords) -> list[float]:
    """Every finished workflow's JCT, in arrival order (for the CDF)."""
    return [w.jct_s for w in records.workflows if w.end_time is not None]


def queue_depth_series(records: RunRecords, points: int = 500) -> dict[str, list[list[float]]]:
    """Per model, ``[[t, depth], ...]``: calls ready but not yet started (global and engine queues
    together, the same span ``queue_s`` measures), ``t`` in seconds from the first arrival.

    The depth is a step function.  With at most ``points`` distinct change times it is returned
    exactly (the depth from each ``t`` on); otherwise the span is cut into ``points`` equal
    intervals and each point is an interval's start with the highest depth inside it, so peaks
    survive the downsampling.
    """
    first = min((w.arrival_time for w in records.workflows), default=0.0)
    changes: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for c in records.calls:
        changes[c.model].append((c.ready_time - first, 1))
        # A call that never started is still queued at the end.
        if c.start_time is not None:
            changes[c.model].append((c.start_time - first, -1))
    end = max(records.duration_s, 0.0)
    return {model: _step_series(events, end, points) for model, events in sorted(changes.items())}


def _step_series(events: list[tuple[float, int]], end: float, points: int) -> list[list[float]]:
    events.sort()  # at one instant, starts (-1) before arrivals (+1): a call that waits 0 never counts
    times = np.array([t for t, _ in events])
    depth = np.cumsum([d for _, d in events])
    last = np.r_[times[1:] != times[:-1], True]  # the depth after all the changes at one instant
    times, depth = times[last], depth[last]
    if len(times) <= points:
        return [[float(t), int(d)] for t, d in zip(times, depth, strict=True)]
    edges = np.linspace(times[0], max(end, times[-1]), points + 1)
    lo = np.searchsorted(times, edges[:-1], side="right")  # first change after each interval's start
    hi = np.searchsorted(times, edges[1:], side="right")
    series: list[list[float]] = []
    for start, i, j in zip(edges[:-1], lo, hi, strict=True):
        carried = int(depth[i - 1]) if i > 0 else 0
        inside = int(depth[i:j].max()) if j > i else carried
        series.append([float(start), max(carried, inside)])
    return series


def global_queue_by_model(records: RunRecords) -> dict[str, dict[str, float]]:
    """Per model, the global queue wait of its placed calls (ready until the scheduler placed
    it: what a model short of replicas costs), mean and P95 seconds, and the calls counted."""
    waits: dict[str, list[float]] = defaultdict(list)
    for c in records.calls:
        if c.dispatch_time is not None:
            waits[c.model].append(c.dispatch_time - c.ready_time)
    return {
        model: {"mean_s": float(np.mean(v)), "p95_s": _pct(v, 95), "calls": float(len(v))}
        for model, v in sorted(waits.items())
    }
