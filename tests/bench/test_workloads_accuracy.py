"""Per-input accuracy labels of the Aragog workloads: configuration spaces, calibration against the
public numbers, near-monotone upgrades (Aragog Figure 7) and the rule for accurate configurations."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from clairvoyant.workloads import (
    SpecError,
    SpecWorkload,
    WorkflowInput,
    WorkloadError,
    agent_depths,
    config_space,
    get_workload,
    label_input,
    labelled_inputs,
    model_costs,
)
from clairvoyant.workloads.accuracy import dataset_accuracy, mask_bits, upgrade_drops

pytestmark = pytest.mark.unit

ARAGOG = ["self_refine", "voting", "task_decomposition", "text_to_sql"]
QWEN = ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b")
DATASET = 4000


def workload(name: str) -> SpecWorkload:
    built = get_workload(name)
    assert isinstance(built, SpecWorkload)
    return built


@cache
def dataset(name: str) -> tuple[WorkflowInput, ...]:
    return tuple(labelled_inputs(workload(name), DATASET, seed=0))


def without_labels(name: str) -> SpecWorkload:
    spec = workload(name).spec
    return SpecWorkload(spec.model_copy(update={"accuracy": None}))


# ---- configuration spaces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "agents", "depths"),
    [
        ("self_refine", ["generate", "critique", "refine"], [2, 1, 0]),
        ("voting", ["voter_1", "voter_2", "voter_3", "voter_4", "aggregator"], [1, 1, 1, 1, 0]),
        ("task_decomposition", ["decomposer", "solver", "aggregator"], [2, 1, 0]),
        ("text_to_sql", ["keyword_extraction", "column_selection", "sql_generation", "refinement"], [3, 2, 1, 0]),
    ],
)
def test_config_space_and_depths(name: str, agents: list[str], depths: list[int]) -> None:
    space = config_space(workload(name))
    assert space is not None
    assert list(space.agents) == agents
    assert space.size == 3 ** len(agents)  # 27, 243, 27, 81
    assert all(options == QWEN for options in space.options)
    assert space.name(space.reference) == "+".join(["qwen2.5-32b"] * len(agents))
    assert agent_depths(workload(name)) == dict(zip(agents, depths, strict=True))
    assert model_costs(workload(name)) == {"qwen2.5-7b": 7.0, "qwen2.5-14b": 14.0, "qwen2.5-32b": 32.0}


def test_no_space_without_alternatives_and_costs_need_a_size() -> None:
    assert config_space(workload("chatbot")) is None
    assert workload("chatbot").input_labeller() is None
    assert model_costs(workload("swe_agent")) == {"llama-3.1-70b": 70.0}
    with pytest.raises(WorkloadError, match="phi-4"):
        model_costs(workload("self_refine").with_models("phi-4"))  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match="no accuracy model"):
        label_input(workload("chatbot"), np.random.default_rng(0))  # type: ignore[arg-type]


def test_voting_has_four_parallel_voters_and_one_aggregator() -> None:
    program = workload("voting").instantiate(np.random.default_rng(4), "v")
    assert [c.agent_id for c in program.calls] == ["voter_1", "voter_2", "voter_3", "voter_4", "aggregator"]
    assert len(program.roots()) == 4
    aggregator = program.calls[-1]
    assert set(aggregator.dependencies) == {c.call_id for c in program.calls[:4]}
    assert {s.call_id for s in aggregator.prompt if s.kind == "call"} == set(aggregator.dependencies)
    assert workload("voting").stats().calls_per_workflow == 5


# ---- attaching labels to programs -------------------------------------------------------------------


@pytest.mark.parametrize("name", ARAGOG)
def test_labels_leave_the_programs_rng_alone(name: str) -> None:
    labelled, plain = workload(name), without_labels(name)
    for i in range(20):
        with_input = labelled.instantiate(np.random.default_rng(i), f"wf-{i}")
        without = plain.instantiate(np.random.default_rng(i), f"wf-{i}")
        assert without.input is None and with_input.input is not None
        assert with_input.calls == without.calls
    # The label depends on the workload and the workflow id only.
    first = labelled.instantiate(np.random.default_rng(1), "same").input
    again = labelled.instantiate(np.random.default_rng(2), "same").input
    assert first == again


def test_same_seed_same_labels() -> None:
    w = workload("text_to_sql")
    assert labelled_inputs(w, 200, seed=5) == labelled_inputs(w, 200, seed=5)
    other = labelled_inputs(w, 200, seed=6)
    assert [x.text for x in other] != [x.text for x in labelled_inputs(w, 200, seed=5)]
    texts = [x.text for x in dataset("text_to_sql")]
    assert len(set(texts)) == len(texts)


# ---- calibration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reference", "base"),
    [("self_refine", 0.88, 0.70), ("voting", 0.70, 0.55), ("task_decomposition", 0.78, 0.64), ("text_to_sql", 0.58, 0.40)],
)
def test_reference_and_all_7b_accuracy(name: str, reference: float, base: float) -> None:
    inputs = dataset(name)
    space = config_space(workload(name))
    assert space is not None
    accuracy = dataset_accuracy(inputs)
    assert accuracy[space.reference] == pytest.approx(reference, abs=0.025)
    assert accuracy[space.base] == pytest.approx(base, abs=0.025)
    assert 0.10 <= accuracy[space.reference] - accuracy[space.base] <= 0.25
    assert accuracy.max() == pytest.approx(accuracy[space.reference], abs=0.02)  # c* is (about) the best
    # Figure 3: numerous configurations match c*'s accuracy on each input (about half of them here).
    accurate = mask_bits([x.accurate for x in inputs], space.size).mean()
    assert 0.3 <= accurate <= 0.7
    # One run per configuration and input: its outcomes average to the expected accuracy.
    runs = mask_bits([x.correct for x in inputs], space.size).mean(axis=0)
    assert np.abs(runs - accuracy).max() < 0.05


def test_upgrades_are_near_monotone() -> None:
    """Figure 7: 8 of 288 single-agent upgrades lose accuracy, none more than 1.5 points."""
    edges = violations = 0
    for name in ARAGOG:
        space = config_space(workload(name))
        assert space is not None
        drops = upgrade_drops(space, dataset_accuracy(dataset(name)))
        edges += sum(1 for c in range(space.size) for _ in space.upgrades(c))
        violations += len(drops)
        assert all(d.drop < 0.015 for d in drops), (name, max(d.drop for d in drops))
    assert 0.01 <= violations / edges <= 0.06


def test_each_input_is_nearly_monotone_along_upgrades() -> None:
    """Chain pruning (§3.1) binary-searches upgrades per input: an upgrade rarely lowers an input's
    chance of a right answer by more than the tolerance, so it rarely turns accurate into not."""
    space = config_space(workload("voting"))
    assert space is not None
    inputs = dataset("voting")[:1000]
    chance = np.array([x.success for x in inputs])
    lower = np.array([c for c in range(space.size) for _ in space.upgrades(c)])
    upper = np.array([u for c in range(space.size) for u in space.upgrades(c)])
    assert (chance[:, lower] - chance[:, upper] > inputs[0].tolerance).mean() < 0.02
    accurate = mask_bits([x.accurate for x in inputs], space.size)
    assert (accurate[:, lower] & ~accurate[:, upper]).mean() < 0.02


# ---- accurate vs correct -------------------------------------------------------------------------------


def test_accurate_is_correct_when_the_reference_is_right_else_everything() -> None:
    right = WorkflowInput("q1 a", "a", 0.2, correct=0b1000_0101, configurations=8)
    wrong = WorkflowInput("q2 b", "b", 0.9, correct=0b0000_0101, configurations=8)
    assert right.reference_correct and right.accurate == 0b1000_0101
    assert not wrong.reference_correct and wrong.accurate == 0b1111_1111
    # With each configuration's chance of a right answer: within the tolerance of c*'s.
    chances = WorkflowInput("q3 c", "c", 0.5, correct=0, configurations=4, success=(0.2, 0.85, 0.88, 0.9), tolerance=0.05)
    assert chances.accurate == 0b1110 and chances.expected_accuracy(1) == 0.85
    for x in dataset("self_refine")[:500]:
        assert x.accurate >> (x.configurations - 1) & 1  # c* always
        assert x.accurate == sum(1 << c for c in range(27) if x.success[c] >= x.success[-1] - x.tolerance)


def test_text_shows_class_and_difficulty() -> None:
    inputs = dataset("task_decomposition")
    assert all(f"{x.input_class}_" in x.text for x in inputs[:200])
    details = np.array([x.text.count("detail") for x in inputs])
    difficulty = np.array([x.difficulty for x in inputs])
    assert np.corrcoef(details, difficulty)[0, 1] > 0.5
    assert {x.input_class for x in inputs} == {"history", "science", "geography", "culture", "sports"}
    assert all(0 <= x.difficulty <= 1 for x in inputs)


# ---- the spec's accuracy block ----------------------------------------------------------------------


def test_accuracy_block_is_validated_and_weights_default_downstream() -> None:
    spec = workload("task_decomposition").spec.model_dump()
    spec["accuracy"]["weights"] = {"solvr": 1.0}
    with pytest.raises(SpecError, match=r"accuracy.weights.solvr: unknown agent 'solvr' \(did you mean 'solver'"):
        SpecWorkload.from_file(spec)
    spec["accuracy"]["weights"] = {}
    spec["accuracy"]["base_accuracy"] = 0.9
    with pytest.raises(SpecError, match="base_accuracy must be <= reference_accuracy"):
        SpecWorkload.from_file(spec)
    spec["accuracy"]["base_accuracy"] = 0.6
    labeller = SpecWorkload.from_file(spec).input_labeller()
    assert labeller is not None
    assert dict(labeller.model.weights) == {"decomposer": 1.0, "solver": 2.0, "aggregator": 3.0}
