"""Output-length priors for agents a profile has never seen, or has seen only a few times.

``LengthPriors`` pools the output lengths of a profile's closed instances by context, most specific
first:

    after:<agent>   calls whose previous step's lead agent was <agent> (a fan-out step's lead is
                    its most frequent agent, ties to the first by name)
    step:<i>        calls of the i-th step (0-based; steps from ``max_step_index`` on share one)
    model:<model>   calls of agents last seen on <model> (records that name it)
    all             every call of the workflow type

A request's prior is the (p50, p99) of the first of its contexts holding at least
``min_context_samples`` lengths; its position comes from the steps its instance has taken so far
(none yet: the first step; a request outside any workflow has no position, only a model and the
whole type).  ``length_interval`` shrinks that prior toward the agent's own interval as
the agent's samples n accumulate: in log(1 + length),

    interval = w * prior + (1 - w) * own,    w = k / (n + k) * max(0, 1 - n / own_after)

with k = ``pseudo_samples``: an unseen agent gets the prior, one seen k times is halfway, and from
``own_after`` samples an agent is served from its own samples alone, exactly as without priors.
Each pool keeps its most recent ``window`` lengths, also in sorted order, so a prior is two list
lookups (quantiles as ``np.quantile(..., method="higher")``): annotating pays no per-agent cost and
no sort.  At most ``max_contexts`` pools are kept (the least recently fed are dropped).  Nothing
here raises on a valid trace.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clairvoyant.profiler.core.stats import AgentSummary
from clairvoyant.profiler.core.trace import Step, WorkflowTrace

Interval = tuple[float, float]
ALL = "all"


@dataclass(frozen=True, slots=True)
class PriorConfig:
    enabled: bool = True  # False: agents are served from their own samples only
    pseudo_samples: float = 8.0  # k: the prior weighs as much as this many of the agent's samples
    # samples from which an agent's own interval is served alone (16: an agent seen that often is
    # its own evidence; a longer taper pulled a steady agent's p50 toward its neighbours')
    own_after: int = 16
    min_context_samples: int = 32  # a context with fewer pooled lengths is skipped
    window: int = 1024  # most recent lengths kept per context
    max_contexts: int = 512  # pools kept (least recently fed dropped first)
    max_step_index: int = 32  # steps from this index on share one context
    max_models: int = 10_000  # agents whose latest model is remembered


def lead_agent(step: Step) -> str:
    """The agent a step is known by as a context: its most frequent agent, ties to the first by name."""
    if len(step.agents) == 1:
        return step.agents[0]
    return Counter(step.agents).most_common(1)[0][0]  # Step.agents is sorted: ties go to the first


class _Pool:
    """The most recent ``window`` lengths of one context, in arrival order and sorted."""

    __slots__ = ("window", "recent", "ordered")

    def __init__(self, window: int, lengths: Iterable[float] = ()) -> None:
        self.window = window
        self.recent: deque[float] = deque()
        self.ordered: list[float] = []
        for length in lengths:
            self.add(length)

    def __len__(self) -> int:
        return len(self.recent)

    def add(self, length: float) -> None:
        if len(self.recent) >= self.window:
            oldest = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, oldest)]
        self.recent.append(length)
        bisect.insort(self.ordered, length)

    def interval(self) -> Interval:
        """(p50, p99), as ``np.quantile(..., method="higher")``: the value at ceil((n - 1) q)."""
        last = len(self.ordered) - 1
        return self.ordered[math.ceil(last * 0.5)], self.ordered[math.ceil(last * 0.99)]


class LengthPriors:
    """A profile's pooled output lengths by context, and the intervals shrunk toward them (module doc)."""

    def __init__(self, config: PriorConfig | None = None) -> None:
        self.config = config or PriorConfig()
        self._pools: OrderedDict[str, _Pool] = OrderedDict()
        self._models: OrderedDict[str, str] = OrderedDict()  # agent -> the model it last ran on

    def note_model(self, agent_id: str, model: str | None) -> None:
        """Remember the model ``agent_id`` ran on (a record's ``model``; None says nothing)."""
        if model is None or not self.config.enabled:
            return
        self._models[agent_id] = model
        self._models.move_to_end(agent_id)
        while len(self._models) > self.config.max_models:
            self._models.popitem(last=False)

    def contexts(self, steps: Sequence[Step] | None, model: str | None) -> list[str]:
        """The contexts of a call after ``steps`` (None: position unknown), most specific first."""
        keys = [] if steps is None else self._positional(steps[-1] if steps else None, len(steps))
        if model is not None:
            keys.append(f"model:{model}")
        keys.append(ALL)
        return keys

    def _positional(self, previous: Step | None, index: int) -> list[str]:
        step = f"step:{min(index, self.config.max_step_index)}"
        return [step] if previous is None else [f"after:{lead_agent(previous)}", step]

    def observe(self, trace: WorkflowTrace) -> None:
        """Pool the output lengths of a closed instance's calls."""
        if not self.config.enabled:
            return
        for i, group in enumerate(trace.calls):
            positional = self._positional(trace.steps[i - 1] if i else None, i)
            for call in group:
                length = float(call.output_tokens)
                model = self._models.get(call.agent_id)
                for key in positional:
                    self._add(key, length)
                if model is not None:
                    self._add(f"model:{model}", length)
                self._add(ALL, length)

    def _add(self, key: str, length: float) -> None:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(self.config.window)
            while len(self._pools) > self.config.max_contexts:
                self._pools.popitem(last=False)
        else:
            self._pools.move_to_end(key)
        pool.add(length)

    def prior(self, agent_id: str, steps: Sequence[Step] | None, model: str | None = None) -> Interval | None:
        """The pooled (p50, p99) of the first context of a call of ``agent_id`` after ``steps`` with
        enough lengths; ``model`` defaults to the agent's last; None when no context has enough."""
        if not self.config.enabled:
            return None
        for key in self.contexts(steps, model if model is not None else self._models.get(agent_id)):
            pool = self._pools.get(key)
            if pool is not None and len(pool) >= self.config.min_context_samples:
                return pool.interval()
        return None

    def length_interval(
        self,
        agent_id: str,
        summary: AgentSummary | None,
        previous_output_len: float | None,
        steps: Sequence[Step] | None,
        model: str | None = None,
    ) -> Interval | None:
        """The (p50, p99) served for a call of ``agent_id`` after ``steps``: the agent's own
        interval (``AgentSummary.length_interval``) shrunk toward its prior (module doc)."""
        own = summary.length_interval(previous_output_len) if summary is not None else None
        samples = summary.output_len.samples if summary is not None and summary.output_len is not None else 0
        if own is not None and samples >= self.config.own_after:
            return own
        prior = self.prior(agent_id, steps, model)
        if prior is None or own is None:
            return own if prior is None else prior
        k = self.config.pseudo_samples
        weight = k / (samples + k) * max(0.0, 1.0 - samples / self.config.own_after)
        return _blend(prior[0], own[0], weight), _blend(prior[1], own[1], weight)

    def to_state(self) -> dict[str, Any]:
        return {
            "pools": [[key, list(pool.recent)] for key, pool in self._pools.items()],
            "models": [[agent, model] for agent, model in self._models.items()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], config: PriorConfig) -> LengthPriors:
        priors = cls(config)
        for key, values in state.get("pools", []):
            priors._pools[key] = _Pool(config.window, (float(v) for v in values))
        priors._models = OrderedDict((agent, model) for agent, model in state.get("models", []))
        return priors


def _blend(prior: float, own: float, prior_weight: float) -> float:
    """The weighted mean of two lengths in log(1 + length)."""
    if prior == own or prior_weight <= 0.0:  # nothing to blend: keep the value exact
        return own
    value = prior_weight * math.log1p(max(prior, 0.0)) + (1.0 - prior_weight) * math.log1p(max(own, 0.0))
    return math.expm1(value)
