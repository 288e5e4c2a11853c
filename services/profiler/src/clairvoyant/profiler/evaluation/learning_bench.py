"""The cost of learning: feed generated sessions through a WorkflowProfile and time it.

    python -m clairvoyant.profiler.evaluation.learning_bench --out bench/results/profiler-learning.json

Two seeded traffics, one workflow type each:

* ``subagents`` — Claude-Code-like sessions: a ``main`` loop (median ~40 calls); in ``--share`` of
  the sessions (20%) main hands over, one to three times, to a sub-agent loop (``explore``,
  ``plan`` or ``general_purpose``, 2..10 calls, explore sometimes several in parallel).
* ``many_agents`` — ``--agents`` distinct agent names (~200): a router, then 3..20 steps of a
  sparse first-order chain over the names (each name has three likely successors), then a writer.

Sessions overlap (``--concurrency`` at once) and are replayed as the evaluation does: a call's
annotation when it starts (history so far), its record when it ends.  Printed and saved per
traffic: annotate p50/p99/max in ms, ingestion records/s (wall time spent in ``ingest``, which
includes every re-learning), and the seconds of each re-learning; each also in CPU time of this
process (``cpu_`` keys), which other load on a shared machine does not inflate.  Compare runs on
the same machine only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from clairvoyant.profiler.core.confidence import ConfidenceConfig
from clairvoyant.profiler.core.profile import CallRecord, ProfileConfig, WorkflowProfile

SUB_AGENTS = ("explore", "plan", "general_purpose")
SUB_AGENT_P = (0.75, 0.1, 0.15)

# A session: a list of steps, each step the agents of its (parallel) calls.
Session = list[list[str]]


def subagent_session(rng: np.random.Generator, share: float) -> Session:
    steps: Session = [["main"] for _ in range(int(rng.lognormal(np.log(40), 0.8)) + 2)]
    if rng.random() < share:
        for _ in range(int(rng.integers(1, 4))):
            agent = str(rng.choice(SUB_AGENTS, p=SUB_AGENT_P))
            run: Session = []
            for _ in range(int(rng.integers(2, 11))):
                width = int(rng.integers(2, 4)) if agent == "explore" and rng.random() < 0.2 else 1
                run.append([agent] * width)
            at = int(rng.integers(1, len(steps)))
            steps[at:at] = [*run, ["main"]]
    return steps


def many_agents_session(rng: np.random.Generator, agents: int) -> Session:
    names = [f"tool-{i:03d}" for i in range(agents)]
    successors = np.random.default_rng(7).integers(0, agents, size=(agents, 3))  # fixed per traffic
    at = int(rng.integers(agents))
    steps: Session = [["router"], [names[at]]]
    for _ in range(int(rng.integers(3, 21))):
        at = (
            int(successors[at][rng.choice(3, p=(0.6, 0.3, 0.1))])
            if rng.random() < 0.9
            else int(rng.integers(agents))
        )
        steps.append([names[at]])
    return [*steps, ["writer"]]


def records(sessions: list[Session], rng: np.random.Generator, concurrency: float) -> list[list[CallRecord]]:
    """Timed records per session: a step's calls run together, 1..4 s each, 0.5 s apart."""
    mean_span = float(np.mean([len(s) for s in sessions])) * 3.0
    out: list[list[CallRecord]] = []
    start = 0.0
    for n, session in enumerate(sessions):
        start += float(rng.exponential(mean_span / concurrency))
        t = start
        calls: list[CallRecord] = []
        for k, step in enumerate(session):
            ends = []
            for j, agent in enumerate(step):
                end = t + float(rng.uniform(1.0, 4.0))
                calls.append(
                    CallRecord(f"s{n}-{k}-{j}", f"s{n}", agent, t, end, 500, int(rng.integers(20, 400)))
                )
                ends.append(end)
            t = max(ends) + 0.5
        last = max(range(len(calls)), key=lambda i: calls[i].end)
        calls[last] = CallRecord(**{**_fields(calls[last]), "workflow_end": True})
        out.append(calls)
    return out


def _fields(record: CallRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__dataclass_fields__}


def run(name: str, sessions: list[list[CallRecord]]) -> dict[str, Any]:
    config = ProfileConfig(confidence=ConfidenceConfig(require_convergence=False))
    profile = WorkflowProfile("bench", name, config)
    relearn_s: list[float] = []
    relearn_cpu_s: list[float] = []
    resynthesize = profile.resynthesize

    def timed_resynthesize() -> None:
        started, cpu = time.perf_counter(), time.process_time()
        resynthesize()
        relearn_s.append(time.perf_counter() - started)
        relearn_cpu_s.append(time.process_time() - cpu)

    profile.resynthesize = timed_resynthesize  # type: ignore[method-assign]
    events = sorted(
        [(r.end, 0, r) for calls in sessions for r in calls]
        + [(r.start, 1, r) for calls in sessions for r in calls],
        key=lambda e: (e[0], e[1]),
    )
    annotate_ms: list[float] = []
    annotate_cpu_ms: list[float] = []
    ingest_s = ingest_cpu_s = 0.0
    for _, kind, record in events:
        started, cpu = time.perf_counter(), time.process_time()
        if kind == 0:
            profile.ingest(record)
            ingest_s += time.perf_counter() - started
            ingest_cpu_s += time.process_time() - cpu
        else:
            profile.annotate(record.agent_id, record.workflow_id)
            annotate_ms.append((time.perf_counter() - started) * 1e3)
            annotate_cpu_ms.append((time.process_time() - cpu) * 1e3)
    n_records = sum(len(s) for s in sessions)
    return {
        "sessions": len(sessions),
        "records": n_records,
        "annotate_p50_ms": float(np.percentile(annotate_ms, 50)),
        "annotate_p99_ms": float(np.percentile(annotate_ms, 99)),
        "annotate_max_ms": float(np.max(annotate_ms)),
        "ingest_records_per_s": n_records / ingest_s if ingest_s > 0 else float("inf"),
        "relearn_s": [round(s, 4) for s in relearn_s],
        "relearn_max_s": max(relearn_s, default=0.0),
        "cpu_annotate_p50_ms": float(np.percentile(annotate_cpu_ms, 50)),
        "cpu_annotate_p99_ms": float(np.percentile(annotate_cpu_ms, 99)),
        "cpu_ingest_records_per_s": n_records / ingest_cpu_s if ingest_cpu_s > 0 else float("inf"),
        "cpu_relearn_s": [round(s, 4) for s in relearn_cpu_s],
        "cpu_relearn_max_s": max(relearn_cpu_s, default=0.0),
        "structured": profile.structured,
        "expression": profile.expression,
    }


TRAFFICS: dict[str, Callable[[argparse.Namespace, np.random.Generator], Session]] = {
    "subagents": lambda args, rng: subagent_session(rng, args.share),
    "many_agents": lambda args, rng: many_agents_session(rng, args.agents),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="learning_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/profiler-learning.json"))
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--share", type=float, default=0.2, help="sessions that use sub-agents")
    parser.add_argument("--agents", type=int, default=190, help="distinct agents of many_agents")
    parser.add_argument("--concurrency", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traffic", choices=sorted(TRAFFICS), action="append", help="default: all")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"seed": args.seed, "sessions": args.sessions, "share": args.share}
    for name in args.traffic or list(TRAFFICS):
        rng = np.random.default_rng(args.seed)
        sessions = [TRAFFICS[name](args, rng) for _ in range(args.sessions)]
        report[name] = result = run(name, records(sessions, rng, args.concurrency))
        print(
            f"{name}: {result['records']} records, annotate p50 {result['annotate_p50_ms']:.3f} ms "
            f"p99 {result['annotate_p99_ms']:.3f} ms max {result['annotate_max_ms']:.1f} ms, "
            f"ingest {result['ingest_records_per_s']:.0f} records/s, "
            f"{len(result['relearn_s'])} re-learnings, max {result['relearn_max_s']:.3f} s"
        )
        print(
            f"  CPU time: annotate p50 {result['cpu_annotate_p50_ms']:.3f} ms "
            f"p99 {result['cpu_annotate_p99_ms']:.3f} ms, ingest {result['cpu_ingest_records_per_s']:.0f} "
            f"records/s, re-learning max {result['cpu_relearn_max_s']:.3f} s, "
            f"total {sum(result['cpu_relearn_s']):.2f} s"
        )
        print(f"  expression: {result['expression'][:160]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
