"""Aragog's pruned search for accurate configurations (seeds/002 §3.1): monotone chains, binary
search, verification, and the call budget."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.pruning import exhaustive_search, monotone_chains, prune_search
from clairvoyant.policy.aragog.routers import KnownSetsRouter

pytestmark = pytest.mark.unit

SHAPES = [(3, 3, 3), (3, 3, 3, 3, 3), (2, 2, 2, 2), (2, 3, 4), (4, 2), (5,)]
TEXT = "the input"


def space_of(options_per_agent: Sequence[int]) -> ConfigSpace:
    return ConfigSpace(
        "workflow",
        tuple(f"agent{i}" for i in range(len(options_per_agent))),
        tuple(tuple(f"m{i}.{level}" for level in range(count)) for i, count in enumerate(options_per_agent)),
    )


class CountingRouter:
    """Labels known exactly (a KnownSetsRouter), counting the ``predict`` calls it answers."""

    def __init__(self, accurate: int) -> None:
        self.known = KnownSetsRouter({TEXT: accurate})
        self.batches: list[list[int]] = []

    def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
        self.batches.append(list(configs))
        return self.known.predict(space, text, configs)


def mask_where(space: ConfigSpace, accurate: Callable[[tuple[int, ...]], bool]) -> int:
    return sum(1 << config for config in range(space.size) if accurate(space.levels(config)))


def is_at_least(upper: tuple[int, ...], lower: tuple[int, ...]) -> bool:
    return all(u >= lo for u, lo in zip(upper, lower, strict=True))


def monotone_labels(space: ConfigSpace, rng: random.Random) -> list[int]:
    """Accurate sets closed under upgrades: level sums, weighted sums, per-agent minimums, and the
    configurations above a few random ones; plus the extremes."""
    top = sum(len(options) - 1 for options in space.options)
    levels = [space.levels(config) for config in range(space.size)]

    def mask(accurate: list[bool]) -> int:
        return sum(1 << config for config, yes in enumerate(accurate) if yes)

    labels = [mask([sum(lv) >= threshold for lv in levels]) for threshold in range(top + 2)]
    for _ in range(8):
        weights = [rng.uniform(0.2, 3.0) for _ in space.agents]
        cut = rng.uniform(0, sum(weights) * 2)
        labels.append(mask([sum(w * x for w, x in zip(weights, lv, strict=True)) >= cut for lv in levels]))
        minimum = tuple(rng.randrange(len(options)) for options in space.options)
        labels.append(mask([is_at_least(lv, minimum) for lv in levels]))
        generators = [levels[rng.randrange(space.size)] for _ in range(rng.randint(1, 4))]
        labels.append(mask([any(is_at_least(lv, g) for g in generators) for lv in levels]))
    return labels


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_chains_run_from_base_to_reference_one_upgrade_a_step_and_cover_the_space(shape: tuple[int, ...]) -> None:
    space = space_of(shape)
    chains = monotone_chains(space)
    covered = 0
    for chain in chains:
        assert chain[0] == space.base and chain[-1] == space.reference
        assert len(chain) == sum(count - 1 for count in shape) + 1
        for lower, upper in zip(chain[:-1], chain[1:], strict=True):
            assert upper in set(space.upgrades(lower))
        for config in chain:
            covered |= 1 << config
    assert covered == space.everything
    assert monotone_chains(space) == chains  # deterministic (and cached)


@pytest.mark.parametrize(("shape", "width"), [((3, 3, 3), 7), ((3, 3, 3, 3, 3), 51), ((2, 2, 2, 2), 6), ((2, 3, 4), 6)])
def test_chain_count_is_the_largest_rank(shape: tuple[int, ...], width: int) -> None:
    # Dilworth: no cover by chains can be smaller than the largest set of equal level sums.
    space = space_of(shape)
    ranks = [sum(space.levels(config)) for config in range(space.size)]
    assert max(ranks.count(rank) for rank in set(ranks)) == width
    assert len(monotone_chains(space)) == width


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_on_monotone_labels_pruning_finds_exactly_the_accurate_set_with_fewer_calls(shape: tuple[int, ...]) -> None:
    space = space_of(shape)
    pruned_calls = exhaustive_calls = 0
    for accurate in monotone_labels(space, random.Random(sum(shape))):
        log = prune_search(space, CountingRouter(accurate), TEXT)
        full = exhaustive_search(space, CountingRouter(accurate), TEXT)
        assert log.complete and full.complete
        assert full.verified() == accurate
        assert log.verified() == accurate
        assert log.calls <= space.size
        assert len({config for config, _ in log.evaluations}) == log.calls  # no configuration twice
        pruned_calls += log.calls
        exhaustive_calls += full.calls
    ratio = pruned_calls / exhaustive_calls
    print(f"{shape}: pruned search runs {ratio:.2f} of the exhaustive router calls")
    assert ratio < (0.9 if space.size > 8 else 1.0)


def test_the_saving_grows_with_the_space() -> None:
    ratios = []
    for shape in [(3, 3), (3, 3, 3), (3, 3, 3, 3, 3)]:
        space = space_of(shape)
        labels = monotone_labels(space, random.Random(7))
        calls = sum(prune_search(space, CountingRouter(accurate), TEXT).calls for accurate in labels)
        ratios.append(calls / (len(labels) * space.size))
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] < 0.75


def test_an_inaccurate_base_prunes_everything_below_the_boundary() -> None:
    # Only the reference is accurate: binary search evaluates a few configurations per chain,
    # verification runs the reference alone.
    space = space_of((3, 3, 3))
    router = CountingRouter(1 << space.reference)
    log = prune_search(space, router, TEXT)
    assert log.verified() == 1 << space.reference
    assert log.calls < space.size // 2
    # Everything accurate: the base's router answers first and every other one is verified.
    log = prune_search(space, CountingRouter(space.everything), TEXT)
    assert log.verified() == space.everything and log.calls == space.size


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_router_calls_are_batched_per_binary_search_step(shape: tuple[int, ...]) -> None:
    space = space_of(shape)
    steps = math.ceil(math.log2(len(monotone_chains(space)[0]) + 1))  # probes of one chain's binary search
    for accurate in monotone_labels(space, random.Random(3)):
        router = CountingRouter(accurate)
        log = prune_search(space, router, TEXT)
        assert len(router.batches) <= steps + 1  # + one verification call
        assert [config for batch in router.batches for config in batch] == [config for config, _ in log.evaluations]


@pytest.mark.parametrize("shape", [(3, 3, 3), (2, 3, 4), (3, 3, 3, 3, 3)], ids=str)
def test_non_monotone_labels_cost_flexibility_never_accuracy(shape: tuple[int, ...]) -> None:
    space = space_of(shape)
    rng = random.Random(11)
    missed = 0
    for accurate in monotone_labels(space, rng):
        for _ in range(3):
            flipped = accurate
            for config in rng.sample(range(space.size), 3):
                flipped ^= 1 << config
            log = prune_search(space, CountingRouter(flipped), TEXT)
            assert log.verified() & ~flipped == 0  # only what the routers called accurate
            assert all(accurate == bool(flipped >> config & 1) for config, accurate in log.evaluations)
            missed += (flipped & ~log.verified()).bit_count()
    assert missed > 0  # the violations did hide some accurate configurations


def test_a_budget_cuts_the_search_to_a_prefix_of_its_evaluations() -> None:
    space = space_of((3, 3, 3))
    accurate = mask_where(space, lambda levels: sum(levels) >= 3)
    full = prune_search(space, CountingRouter(accurate), TEXT)
    for budget in range(full.calls + 2):
        router = CountingRouter(accurate)
        cut = prune_search(space, router, TEXT, max_calls=budget)
        assert cut.evaluations == full.evaluations[:budget]
        assert cut.complete == (budget >= full.calls)
        assert cut.verified() == full.verified(budget)
        assert sum(len(batch) for batch in router.batches) == min(budget, full.calls)
    assert full.verified(0) == 0 and full.verified(None) == accurate


def test_a_zero_budget_runs_no_router() -> None:
    space = space_of((2, 3, 4))
    router = CountingRouter(space.everything)
    log = prune_search(space, router, TEXT, max_calls=0)
    assert log.verified() == 0 and log.calls == 0 and not log.complete
    assert router.batches == []
    cut = exhaustive_search(space, router, TEXT, max_calls=5)
    assert [config for config, _ in cut.evaluations] == [0, 1, 2, 3, 4] and not cut.complete


def test_exhaustive_search_runs_every_router_in_index_order() -> None:
    space = space_of((3, 2))
    log = exhaustive_search(space, CountingRouter(0b101010), TEXT)
    assert log.evaluations == tuple((config, config in {1, 3, 5}) for config in range(6))
    assert log.complete and log.verified() == 0b101010


def test_a_router_that_answers_the_wrong_number_of_configurations_is_an_error() -> None:
    class Short:
        def predict(self, space: ConfigSpace, text: str, configs: Sequence[int]) -> list[bool]:
            return [True] * (len(configs) - 1)

    with pytest.raises(ValueError, match="answered"):
        prune_search(space_of((3, 3)), Short(), TEXT)
