"""Where a workflow's configuration set comes from, once, when its first call is queued: Aragog's
budgeted router search (seeds/002 §3.1) and the two baselines of §5.1.

    AragogSearch         prune_search with the (group, workflow type)'s router, cut to the budget
    PerInputChoice      the cheapest accurate configuration of the router's full answer, no delay
    PerWorkflowChoice   one configuration per workflow type, fixed in advance

Each returns a set (an int mask over the workflow's ``ConfigSpace``) and how long finding it
takes; the scheduler holds the workflow's calls back that long.  With one configuration in the
set, beam search has one model per stage: the baselines get the same meta-queue and graph-aware
scheduling as Aragog ("all baselines incorporate the same graph-aware scheduling", §5.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import ModelGroup
from clairvoyant.policy.aragog.pruning import prune_search
from clairvoyant.policy.aragog.types import ConfigRouter

_SLACK = 1e-9  # 0.045 / 0.005 is 8.999999999999998 in floats: it must allow 9 calls


class RoutedSet(NamedTuple):
    mask: int  # the workflow's configuration set (never empty)
    routing_s: float  # how long finding it takes: the first call is assignable this long after it arrived
    router_calls: int  # router calls the answer rests on
    complete: bool = True  # False: the budget cut the search short


class ConfigSetStrategy(Protocol):
    def configuration_set(self, group: ModelGroup, space: ConfigSpace, text: str, budget_s: float) -> RoutedSet:
        """The set of the workflow (of ``space``, in ``group``) whose input is ``text``, searched
        within ``budget_s`` seconds where the strategy searches.  Deterministic."""
        ...


def reference_only(space: ConfigSpace) -> int:
    return 1 << space.reference


class AragogSearch:
    """Aragog's set (§3.1, "Overall operation"): ``prune_search`` with the router of (group,
    workflow type), allowed floor(budget / router_call_s) router calls (no limit when
    ``router_call_s`` is 0, i.e. the router runs at submit and its time is not modelled).  The set
    is what the routers verified within the calls made; none verified: {c*}.  No router for the
    workflow type: {c*} (nobody profiled its accurate configurations)."""

    def __init__(self, routers: Mapping[tuple[str, str], ConfigRouter] | None = None, router_call_s: float = 0.0) -> None:
        if router_call_s < 0:
            raise ValueError("router_call_s must be >= 0")
        self.routers = dict(routers or {})
        self.router_call_s = router_call_s

    def configuration_set(self, group: ModelGroup, space: ConfigSpace, text: str, budget_s: float) -> RoutedSet:
        router = self.routers.get((group.name, space.workflow_type))
        if router is None:
            return RoutedSet(reference_only(space), 0.0, 0)
        max_calls = None if self.router_call_s == 0 else int(budget_s / self.router_call_s + _SLACK)
        log = prune_search(space, router, text, max_calls)
        calls = log.calls if max_calls is None else min(log.calls, max_calls)
        complete = log.complete and calls == log.calls
        return RoutedSet(log.verified(calls) or reference_only(space), calls * self.router_call_s, calls, complete)


class PerInputChoice:
    """The per-input baseline (§5.1): the cheapest accurate configuration for the input, by the
    group's ``model_cost`` (ties: the smaller configuration index), from the router's answer for
    every configuration (an oracle router in the simulator), fixed at arrival; none accurate, or
    no router: c*.  "We remove the router inference overhead for the per-input baseline": no
    routing time."""

    def __init__(self, routers: Mapping[tuple[str, str], ConfigRouter] | None = None) -> None:
        self.routers = dict(routers or {})

    def configuration_set(self, group: ModelGroup, space: ConfigSpace, text: str, budget_s: float) -> RoutedSet:
        router = self.routers.get((group.name, space.workflow_type))
        if router is None:
            return RoutedSet(reference_only(space), 0.0, 0)
        configs = list(range(space.size))
        accurate = [c for c, ok in zip(configs, router.predict(space, text, configs), strict=True) if ok]
        if not accurate:
            return RoutedSet(reference_only(space), 0.0, len(configs))
        cheapest = min(accurate, key=lambda config: (space.cost(config, group.model_cost), config))
        return RoutedSet(1 << cheapest, 0.0, len(configs))


class PerWorkflowChoice:
    """The per-workflow baseline (§5.1): one configuration per (group, workflow type) for every
    request, ``fixed`` in advance (the simulator computes it from the dataset: the cheapest
    configuration that matches the reference's accuracy); a type it does not name runs c*."""

    def __init__(self, fixed: Mapping[tuple[str, str], int] | None = None) -> None:
        self.fixed = dict(fixed or {})

    def configuration_set(self, group: ModelGroup, space: ConfigSpace, text: str, budget_s: float) -> RoutedSet:
        config = self.fixed.get((group.name, space.workflow_type), space.reference)
        if not 0 <= config < space.size:
            raise ValueError(f"configuration {config} is not in {space.workflow_type!r}'s space of {space.size}")
        return RoutedSet(1 << config, 0.0, 0)


class SearchStats:
    """Counts of a policy's configuration searches and of how its workflows' first calls waited."""

    def __init__(self) -> None:
        self.workflows = 0
        self.routing_s = 0.0
        self.router_calls = 0
        self.cut_short = 0
        self.first_calls = 0
        self.hidden = 0

    def searched(self, routing_s: float, router_calls: int, complete: bool) -> None:
        self.workflows += 1
        self.routing_s += routing_s
        self.router_calls += router_calls
        self.cut_short += not complete

    def first_call(self, hidden: bool) -> None:
        self.first_calls += 1
        self.hidden += hidden

    def summary(self) -> dict[str, float]:
        searched = max(1, self.workflows)
        return {
            "workflows": float(self.workflows),
            "routing_ms_mean": 1e3 * self.routing_s / searched,
            "router_calls_mean": self.router_calls / searched,
            "cut_short_fraction": self.cut_short / searched,
            "hidden_fraction": self.hidden / max(1, self.first_calls),
        }
