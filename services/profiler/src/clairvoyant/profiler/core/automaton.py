"""The transition automaton: counts of step-to-step transitions, with start and end states.

Pythia (seed 000, §4.1) mines the traces into a probabilistic finite automaton and prunes
transitions "occurring in less than 5% of cases" ("optimizing for the dominant percentile").

Choices:
* States are step labels: an agent id for a one-call step, ``<a|b>`` (the sorted distinct members)
  for a parallel group, plus ``^`` (start) and ``$`` (end).
* "5% of cases" is read per trace: a transition u -> v is kept when at least ``threshold`` of the
  traces that visit u take it at least once.  Counting per transition instead would prune the exit
  of every long loop (a 20-iteration self-loop leaves through its exit edge 1 time in 21).
* Transition probabilities (for the Markov view) use the raw transition counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clairvoyant.profiler.core.trace import Step

START = "^"
END = "$"
DEFAULT_PRUNE_THRESHOLD = 0.05


def step_label(step: Step) -> str:
    if len(step.agents) == 1:
        return step.agents[0]
    return "<" + "|".join(sorted(set(step.agents))) + ">"


def trace_labels(steps: Sequence[Step]) -> list[str]:
    return [START, *(step_label(s) for s in steps), END]


@dataclass
class TransitionAutomaton:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # u -> v -> transitions
    support: dict[str, dict[str, int]] = field(default_factory=dict)  # u -> v -> traces taking u->v
    visits: dict[str, int] = field(default_factory=dict)  # u -> traces visiting u
    traces: int = 0

    @classmethod
    def from_traces(cls, traces: Iterable[Sequence[Step]]) -> TransitionAutomaton:
        automaton = cls()
        for steps in traces:
            automaton.add(steps)
        return automaton

    def add(self, steps: Sequence[Step], count: int = 1) -> None:
        """Learn ``count`` traces with these steps."""
        labels = trace_labels(steps)
        self.traces += count
        for u in set(labels[:-1]):
            self.visits[u] = self.visits.get(u, 0) + count
        for u, v in zip(labels, labels[1:], strict=False):
            row = self.counts.setdefault(u, {})
            row[v] = row.get(v, 0) + count
        for u, v in set(zip(labels, labels[1:], strict=False)):
            row = self.support.setdefault(u, {})
            row[v] = row.get(v, 0) + count

    @property
    def states(self) -> list[str]:
        names = set(self.counts) | {v for row in self.counts.values() for v in row}
        return sorted(names - {START, END})

    def successors(self, u: str) -> dict[str, float]:
        """P(next = v | current = u), from transition counts."""
        row = self.counts.get(u, {})
        total = sum(row.values())
        return {v: n / total for v, n in sorted(row.items())} if total else {}

    def pruned(self, threshold: float = DEFAULT_PRUNE_THRESHOLD) -> TransitionAutomaton:
        """A copy without the transitions taken by fewer than ``threshold`` of the traces visiting u."""
        kept = TransitionAutomaton(traces=self.traces, visits=dict(self.visits))
        for u, row in self.support.items():
            visits = self.visits.get(u, 0)
            for v, n in row.items():
                if visits and n / visits >= threshold:
                    kept.support.setdefault(u, {})[v] = n
                    kept.counts.setdefault(u, {})[v] = self.counts[u][v]
        return kept

    def allows(self, steps: Sequence[Step]) -> bool:
        labels = trace_labels(steps)
        return all(v in self.counts.get(u, {}) for u, v in zip(labels, labels[1:], strict=False))

    def expected_remaining_steps(self) -> dict[str, float]:
        """Expected steps still to come after a step with each label (``^``: the whole trace), from
        the absorbing Markov chain: t = (I - Q)^-1 1 over the transient states, minus the current one.
        States that cannot reach ``$`` get infinity."""
        transient = [START, *self.states]
        index = {s: i for i, s in enumerate(transient)}
        q = np.zeros((len(transient), len(transient)))
        for u in transient:
            for v, p in self.successors(u).items():
                if v != END:
                    q[index[u], index[v]] = p
        try:
            visits = np.linalg.solve(np.eye(len(transient)) - q, np.ones(len(transient)))
        except np.linalg.LinAlgError:
            visits = np.full(len(transient), np.inf)
        return {
            s: float(visits[index[s]] - 1.0) if np.isfinite(visits[index[s]]) else float("inf")
            for s in transient
        }

    def to_state(self) -> dict[str, Any]:
        return {"counts": self.counts, "support": self.support, "visits": self.visits, "traces": self.traces}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TransitionAutomaton:
        return cls(
            counts={u: dict(r) for u, r in state["counts"].items()},
            support={u: dict(r) for u, r in state["support"].items()},
            visits=dict(state["visits"]),
            traces=int(state["traces"]),
        )
