"""Aragog's scheduling round (seeds/002 §3.2, Figure 9): beam search against an independent greedy
search and against exhaustive search, and the round's rules (pruning, look-ahead, FIFO)."""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator, Sequence

import pytest

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.policy.aragog.beam import (
    Placement,
    Replica,
    RoundPlan,
    Stage,
    StageOption,
    beam_assign,
    exhaustive_assign,
    greedy_assign,
)

pytestmark = pytest.mark.unit

MODELS = ("small", "mid", "large")
SPACE = ConfigSpace("pair", ("plan", "act"), (MODELS, MODELS))  # 9 configurations


def stage(number: int, workflow: Hashable, agent: str, mask: int, excluded: frozenset[str] = frozenset()) -> Stage:
    """A stage of SPACE's ``agent`` whose workflow's set is ``mask``: its options are the models
    the set still allows, cheapest first."""
    options = tuple(StageOption(m, SPACE.uses(agent, m)) for m in SPACE.viable_models(mask, agent))
    return Stage(number, workflow, mask, options, excluded)


def fixed_stage(number: int, model: str) -> Stage:
    """A call that may run on one model only and prunes nothing (a workflow of its own)."""
    return Stage(number, f"lone{number}", 1, (StageOption(model, -1),))


def config(plan: str, act: str) -> int:
    return SPACE.config_of({"plan": plan, "act": act})


def mask_of(*configs: int) -> int:
    mask = 0
    for c in configs:
        mask |= 1 << c
    return mask


# ---- an independent greedy search (what width 1 must be) ---------------------------------------


def reference_greedy(stages: Sequence[Stage], replicas: Sequence[Replica]) -> tuple[list[Placement], float, float]:
    """Each stage in order takes the option with the best (total gain, mean kept fraction), the
    first such option on ties; its replica is the one with the highest next gain, the smallest
    worker id on ties."""
    used = {r.worker_id: 0 for r in replicas}
    masks: dict[Hashable, int] = {}
    before: dict[Hashable, int] = {}
    placements: list[Placement] = []
    total = 0.0

    def kept(trial: dict[Hashable, int]) -> float:
        return sum(m.bit_count() / before[w] for w, m in trial.items()) / len(trial) if trial else 1.0

    for s in stages:
        before.setdefault(s.workflow, s.mask.bit_count())
        best = None
        for option in s.options:
            pruned = masks.get(s.workflow, s.mask) & option.uses
            if not pruned:
                continue
            free = [
                r
                for r in sorted(replicas, key=lambda r: r.worker_id)
                if r.model == option.model and used[r.worker_id] < len(r.gains) and r.worker_id not in s.excluded
            ]
            if not free:
                continue
            replica = max(free, key=lambda r: r.gains[used[r.worker_id]])  # max keeps the first of equals
            gain = replica.gains[used[replica.worker_id]]
            trial = {**masks, s.workflow: pruned}
            key = (round(total + gain, 9), round(kept(trial), 9))
            if best is None or key > best[0]:
                best = (key, option.model, replica, gain, trial)
        if best is not None:
            _, model, replica, gain, trial = best
            used[replica.worker_id] += 1
            masks = trial
            total += gain
            placements.append(Placement(s.number, model, replica.worker_id))
    return placements, total, kept(masks)


# ---- random small instances -------------------------------------------------------------------


def random_instance(rng: random.Random) -> tuple[list[Stage], list[Replica]]:
    workflows = [f"w{i}" for i in range(rng.randint(1, 3))]
    masks = {w: rng.randrange(1, 1 << SPACE.size) for w in workflows}
    stages = []
    for number in range(rng.randint(1, 6)):
        workflow = rng.choice(workflows)
        excluded = frozenset({"r0"}) if rng.random() < 0.15 else frozenset()
        stages.append(stage(number, workflow, rng.choice(SPACE.agents), masks[workflow], excluded))
    replicas = []
    for i in range(rng.randint(1, 4)):
        gains = tuple(float(rng.randint(0, 3)) for _ in range(rng.randint(1, 2)))
        replicas.append(Replica(f"r{i}", rng.choice(MODELS), gains))
    return stages, replicas


@pytest.mark.parametrize("seed", range(200))
def test_width_one_is_the_greedy_search(seed: int) -> None:
    stages, replicas = random_instance(random.Random(seed))
    placements, utilization, flexibility = reference_greedy(stages, replicas)
    plan = greedy_assign(stages, replicas)
    assert list(plan.placements) == placements
    assert plan.objective == pytest.approx((utilization, flexibility))


@pytest.mark.parametrize("seed", range(200))
def test_a_wide_beam_finds_an_exhaustive_optimum(seed: int) -> None:
    stages, replicas = random_instance(random.Random(seed))
    optimal = exhaustive_assign(stages, replicas)
    plan = beam_assign(stages, replicas, width=10_000)
    assert plan.objective == pytest.approx(optimal[0].objective)
    assert plan.placements in {o.placements for o in optimal}
    if len(optimal) == 1:
        assert plan == optimal[0]
    for width in (1, 2, 4):  # a narrower beam never beats the optimum
        narrow = beam_assign(stages, replicas, width=width)
        assert (round(narrow.utilization, 9), round(narrow.flexibility, 9)) <= (
            round(plan.utilization, 9),
            round(plan.flexibility, 9),
        )


def test_beam_search_avoids_greedy_myopia() -> None:
    # The first call gains more on small, but the second can only run on small: greedy places
    # one call, a beam of 2 both (Figure 10: near-exhaustive quality).
    stages = [stage(0, "w0", "plan", SPACE.everything), fixed_stage(1, "small")]
    replicas = [Replica("a", "small", (2.0,)), Replica("b", "mid", (1.0,))]
    assert greedy_assign(stages, replicas).placements == (Placement(0, "small", "a"),)
    plan = beam_assign(stages, replicas, width=2)
    assert plan.placements == (Placement(0, "mid", "b"), Placement(1, "small", "a"))
    assert plan.utilization == 3.0
    assert [p.placements for p in exhaustive_assign(stages, replicas)] == [plan.placements]


# ---- the round's rules ------------------------------------------------------------------------


def test_a_placement_prunes_the_workflows_set_exactly_for_its_later_stages() -> None:
    accurate = mask_of(config("small", "small"), config("mid", "large"), config("large", "large"))
    stages = [stage(0, "w", "plan", accurate), stage(1, "w", "act", accurate)]
    assert [o.model for o in stages[1].options] == ["small", "large"]  # before the round
    # plan on small (a tie with large, cheapest first) leaves act only small, which is full: act
    # is not placed on large although large has a free slot
    replicas = [Replica("s", "small", (1.0,)), Replica("l", "large", (1.0,))]
    plan = beam_assign(stages, replicas)
    assert plan.placements == (Placement(0, "small", "s"),)
    assert plan.masks == {"w": accurate & SPACE.uses("plan", "small")}
    assert plan.masks["w"] == mask_of(config("small", "small"))
    # with a second large slot, plan on large lets act follow it there: two placements beat one
    replicas = [Replica("s", "small", (1.0,)), Replica("l", "large", (1.0, 1.0))]
    plan = beam_assign(stages, replicas)
    assert plan.placements == (Placement(0, "large", "l"), Placement(1, "large", "l"))
    assert plan.masks == {"w": mask_of(config("large", "large"))}
    assert plan.flexibility == pytest.approx(1 / 3)


def test_flexibility_breaks_ties_in_utilization() -> None:
    # plan on large keeps two of the three configurations, on mid one
    accurate = mask_of(config("mid", "large"), config("large", "mid"), config("large", "large"))
    replicas = [Replica("m", "mid", (1.0,)), Replica("l", "large", (1.0,))]
    plan = beam_assign([stage(0, "w", "plan", accurate)], replicas)
    assert plan.placements == (Placement(0, "large", "l"),)
    assert plan.flexibility == pytest.approx(2 / 3)


def test_look_ahead_skips_a_blocked_call_and_places_a_later_one() -> None:
    stages = [fixed_stage(0, "large"), fixed_stage(1, "large"), stage(2, "w", "plan", SPACE.everything)]
    replicas = [Replica("s", "small", (1.0,))]  # large has no free slot
    plan = beam_assign(stages, replicas)
    assert plan.placements == (Placement(2, "small", "s"),)


def test_fifo_the_earlier_call_gets_the_only_slot() -> None:
    stages = [stage(0, "early", "plan", SPACE.everything), stage(1, "late", "plan", SPACE.everything)]
    plan = beam_assign(stages, [Replica("m", "mid", (1.0,))], width=8)
    assert plan.placements == (Placement(0, "mid", "m"),)


def test_a_replica_with_the_highest_gain_is_chosen_and_exclusions_hold() -> None:
    replicas = [Replica("b", "mid", (1.0,)), Replica("a", "mid", (1.0,)), Replica("c", "mid", (5.0, 0.5))]
    plan = beam_assign([fixed_stage(i, "mid") for i in range(3)], replicas)
    # c gains most for its first call, then a and b tie at 1.0 (c's second gains 0.5): a first
    assert [p.worker_id for p in plan.placements] == ["c", "a", "b"]
    assert plan.utilization == 7.0
    excluded = Stage(0, "x", 1, (StageOption("mid", -1),), frozenset({"c"}))
    assert beam_assign([excluded], replicas).placements == (Placement(0, "mid", "a"),)


def test_the_search_reads_stages_only_until_no_slot_is_left() -> None:
    read: list[int] = []

    def stages() -> Iterator[Stage]:
        for number in range(1_000):
            read.append(number)
            yield fixed_stage(number, "mid")

    plan = beam_assign(stages(), [Replica("m", "mid", (1.0, 1.0))])
    assert [p.stage for p in plan.placements] == [0, 1]
    assert read == [0, 1]


def test_nothing_to_place_and_bad_width() -> None:
    empty = RoundPlan((), 0.0, 1.0, {})
    assert beam_assign([fixed_stage(0, "mid")], []) == empty
    assert beam_assign([], [Replica("m", "mid", (1.0,))]) == empty
    assert beam_assign([fixed_stage(0, "large")], [Replica("m", "mid", (1.0,))]) == empty
    with pytest.raises(ValueError, match="width"):
        beam_assign([], [], width=0)
