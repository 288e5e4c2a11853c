"""Run metrics as the seeds define them, computed from ``RunRecords`` (simulated or live alike).

- JCT: a workflow's arrival to the end of its last call (and the tool after it).
- Program-level token latency (Autellix §6, Kairos §7): a workflow's JCT divided by the output
  tokens it generated, averaged over workflows.
- Distance from the limit: average JCT over the average critical-path lower bound.
- SLO attainment: the share of workflows whose JCT is within ``k`` times their own lower bound.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from clairvoyant.bench.records import RunRecords

SLO_MULTIPLES = (2.0, 5.0, 10.0)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(records: RunRecords) -> dict[str, Any]:
    done = [w for w in records.workflows if w.end_time is not None]
    jcts = [w.jct_s for w in done]
    bounds = [w.lower_bound_s for w in done]
    calls = [c for c in records.calls if c.end_time is not None]
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
    return {
        "workflows": len(done),
        "calls": len(calls),
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
        "preemptions": records.preemptions,
        "lower_bound_avg_jct_s": avg_bound,
        "distance_from_limit": avg_jct / avg_bound if avg_bound else 0.0,
        "slo_attainment": {
            f"{k:g}x": sum(j <= k * b for j, b in zip(jcts, bounds, strict=True)) / len(done) if done else 0.0
            for k in SLO_MULTIPLES
        },
        "duration_s": records.duration_s,
    }
