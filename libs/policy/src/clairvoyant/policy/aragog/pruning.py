"""The search for a request's accurate configurations (Aragog, seeds/002 §3.1, "Pruning router
inferences").

Accuracy is near-monotone under model upgrades, so the search runs the routers of a few
configurations and *presumes* the rest: a configuration at or above (every agent on the same or a
larger model) one whose router said accurate is presumed accurate; one at or below a configuration
whose router said inaccurate is presumed inaccurate.  It then verifies every presumed-accurate
configuration by running its own router.  A presumption is never an answer: ``verified()`` holds
only configurations whose own router said accurate, so a monotonicity violation costs
flexibility (an accurate configuration presumed inaccurate is never run), never accuracy.

Choices where the seed is silent:

- Chains (``monotone_chains``) cover the space greedily, each through the first configuration no
  earlier chain covers; the seed's "DFS from the base configuration" names the walk, not the cover.
  On the spaces the tests use this reaches the fewest chains possible (the largest rank).
- The chains are searched in lockstep: each round takes one binary-search probe from every chain
  whose boundary is still open and runs them in one ``predict`` (deduplicated, in chain order).
- A configuration evaluated by its own router takes that answer; otherwise a presumption of
  accuracy wins over one of inaccuracy (they only conflict where the labels are not monotone), so
  such a configuration is verified rather than pruned.
- Verification runs in increasing configuration order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import NamedTuple

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.types import ConfigRouter


class SearchLog(NamedTuple):
    """What one search ran, in order; a budget of ``k`` calls is its first ``k`` evaluations."""

    evaluations: tuple[tuple[int, bool], ...]  # (configuration, its router said accurate), in call order
    complete: bool  # False when max_calls cut the search short

    @property
    def calls(self) -> int:
        return len(self.evaluations)

    def verified(self, calls: int | None = None) -> int:
        """Mask of configurations a router called accurate within the first ``calls`` evaluations
        (all when None)."""
        taken = self.evaluations if calls is None else self.evaluations[: max(calls, 0)]
        mask = 0
        for config, accurate in taken:
            if accurate:
                mask |= 1 << config
        return mask


@lru_cache(maxsize=64)
def monotone_chains(space: ConfigSpace) -> tuple[tuple[int, ...], ...]:
    """Chains from ``space.base`` to ``space.reference``, each step one agent up one option,
    together covering every configuration.

    Each chain is built through the lowest-numbered configuration no earlier chain covers: walk
    down from it to the base and up from it to the reference, at every step taking the first
    neighbour (in agent order) that no chain covers yet, else the first neighbour.
    """
    chains: list[tuple[int, ...]] = []
    covered = 0
    for target in range(space.size):
        if covered >> target & 1:
            continue
        below = _walk(target, space.base, lambda config: _downgrades(space, config), covered)
        above = _walk(target, space.reference, lambda config: list(space.upgrades(config)), covered)
        chain = tuple(reversed(below)) + tuple(above[1:])
        for config in chain:
            covered |= 1 << config
        chains.append(chain)
    return tuple(chains)


def prune_search(space: ConfigSpace, router: ConfigRouter, text: str, max_calls: int | None = None) -> SearchLog:
    """Binary-search every monotone chain for its inaccurate->accurate boundary, then verify
    every presumed-accurate configuration not yet evaluated (see the module docstring).
    ``max_calls``: stop after that many router calls (None: no limit)."""
    search = _Search(space, router, text, max_calls)
    chains = monotone_chains(space)
    # bounds[i] = [lo, hi]: chain i is inaccurate at lo and accurate at hi; -1 and len(chain)
    # stand for the virtual ends below the base and above the reference.
    #
    #   position:  -1 | 0    1    2    3    4 | 5
    #                 |  base ............ ref |
    #                 lo -->  probe (lo+hi)//2  <-- hi
    bounds = [[-1, len(chain)] for chain in chains]
    while True:
        probes: list[int] = []
        for chain, bound in zip(chains, bounds, strict=True):
            while bound[1] - bound[0] > 1:
                middle = (bound[0] + bound[1]) // 2
                status = search.status(chain[middle])
                if status is None:
                    if chain[middle] not in probes:
                        probes.append(chain[middle])
                    break
                bound[1 if status else 0] = middle
        if not probes:
            break
        if not search.run(probes):
            return search.log(complete=False)
    candidates = list(space.members(search.presumed_accurate & ~search.evaluated))
    return search.log(complete=search.run(candidates))


def exhaustive_search(space: ConfigSpace, router: ConfigRouter, text: str, max_calls: int | None = None) -> SearchLog:
    """Run every configuration's router, in index order (the seed's unpruned baseline)."""
    search = _Search(space, router, text, max_calls)
    return search.log(complete=search.run(list(range(space.size))))


class _Search:
    """The knowledge of one search: what the routers said, and the masks it presumes."""

    def __init__(self, space: ConfigSpace, router: ConfigRouter, text: str, max_calls: int | None) -> None:
        self.space, self.router, self.text = space, router, text
        self.remaining = max_calls
        self.evaluations: list[tuple[int, bool]] = []
        self.evaluated = 0
        self.said_accurate = 0
        self.presumed_accurate = 0  # at or above a configuration whose router said accurate
        self.presumed_inaccurate = 0  # at or below one whose router said inaccurate
        self.closures = _closures(space)

    def status(self, config: int) -> bool | None:
        """Accurate, inaccurate, or None when neither evaluated nor presumed."""
        bit = 1 << config
        if self.evaluated & bit:
            return bool(self.said_accurate & bit)
        if self.presumed_accurate & bit:
            return True
        if self.presumed_inaccurate & bit:
            return False
        return None

    def run(self, configs: Sequence[int]) -> bool:
        """Run the routers of ``configs`` (as many as the budget allows) in one call; False when the
        budget cut some off."""
        taken = list(configs) if self.remaining is None else list(configs[: self.remaining])
        if taken:
            answers = self.router.predict(self.space, self.text, taken)
            if len(answers) != len(taken):
                raise ValueError(f"router answered {len(answers)} of {len(taken)} configurations")
            for config, accurate in zip(taken, answers, strict=True):
                self._record(config, bool(accurate))
        if self.remaining is not None:
            self.remaining -= len(taken)
        return len(taken) == len(configs)

    def _record(self, config: int, accurate: bool) -> None:
        self.evaluations.append((config, accurate))
        self.evaluated |= 1 << config
        if accurate:
            self.said_accurate |= 1 << config
            self.presumed_accurate |= self.closures.above(config)
        else:
            self.presumed_inaccurate |= self.closures.below(config)

    def log(self, complete: bool) -> SearchLog:
        return SearchLog(tuple(self.evaluations), complete)


class _Closures:
    """Masks of the configurations at or above / at or below one configuration."""

    def __init__(self, space: ConfigSpace) -> None:
        self.space = space
        self.at_least: list[list[int]] = []  # [agent][level]: mask of configs with that agent >= level
        self.at_most: list[list[int]] = []
        for agent, options in zip(space.agents, space.options, strict=True):
            per_level = [space.uses(agent, model) for model in options]
            self.at_least.append([_union(per_level[level:]) for level in range(len(options))])
            self.at_most.append([_union(per_level[: level + 1]) for level in range(len(options))])

    def above(self, config: int) -> int:
        mask = self.space.everything
        for position, level in enumerate(self.space.levels(config)):
            mask &= self.at_least[position][level]
        return mask

    def below(self, config: int) -> int:
        mask = self.space.everything
        for position, level in enumerate(self.space.levels(config)):
            mask &= self.at_most[position][level]
        return mask


@lru_cache(maxsize=64)
def _closures(space: ConfigSpace) -> _Closures:
    return _Closures(space)


def _union(masks: Sequence[int]) -> int:
    union = 0
    for mask in masks:
        union |= mask
    return union


def _downgrades(space: ConfigSpace, config: int) -> list[int]:
    """The configurations one step cheaper than ``config`` (the reverse of ``space.upgrades``)."""
    levels = space.levels(config)
    return [
        space.config([*levels[:position], level - 1, *levels[position + 1 :]])
        for position, level in enumerate(levels)
        if level > 0
    ]


def _walk(start: int, end: int, neighbours: Callable[[int], list[int]], covered: int) -> list[int]:
    """From ``start`` to ``end`` one neighbour at a time, preferring configurations not yet covered."""
    path = [start]
    while path[-1] != end:
        steps = neighbours(path[-1])
        path.append(next((step for step in steps if not covered >> step & 1), steps[0]))
    return path
