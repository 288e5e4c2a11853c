"""Aragog's evaluation in the simulator (``python -m clairvoyant.bench aragog``), on a small instance."""

from __future__ import annotations

import pytest

from clairvoyant.bench import aragog
from clairvoyant.bench.aragog import AragogSetup, Prepared, cluster, engine_profiles, run_arm

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def prepared() -> Prepared:
    return Prepared(AragogSetup("self_refine", (6.0,), workflows=60, train_inputs=300))


def test_the_seeds_cluster_gives_the_routers_gpu_to_a_second_7b_for_the_baselines() -> None:
    def gpus(arm: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for spec in cluster(arm, "H100-80G"):
            counts[spec.runner.info.name] = counts.get(spec.runner.info.name, 0) + spec.runner.cost.tp  # type: ignore[attr-defined]
        return counts

    assert gpus("aragog") == {"qwen2.5-32b": 4, "qwen2.5-14b": 2, "qwen2.5-7b": 1}
    assert gpus("aragog-per-input") == {"qwen2.5-32b": 4, "qwen2.5-14b": 2, "qwen2.5-7b": 2}


def test_saturation_is_where_throughput_stops_improving_enough() -> None:
    replicas = cluster("aragog", "H100-80G")
    knee, flat = engine_profiles(replicas, 800, "knee"), engine_profiles(replicas, 800, "flat")
    for model, profile in knee.items():
        curve = profile.throughput
        assert curve[0] == 0 and all(b > a for a, b in zip(curve, curve[1:], strict=False))
        assert 1 < profile.saturation < flat[model].saturation <= 256
        assert profile.gain(profile.saturation) == 0.0 and profile.gain(0) == curve[1]
    with pytest.raises(ValueError, match="saturation"):
        engine_profiles(replicas, 800, "steep")


def test_per_workflow_runs_one_configuration_and_the_oracle_keeps_the_reference_accuracy(prepared: Prepared) -> None:
    space = prepared.space
    fixed = space.models(prepared.fixed)
    per_workflow = run_arm(prepared, "aragog-per-workflow", 6.0)
    assert per_workflow["workflows"] == 60
    expected: dict[str, int] = {}
    for model in fixed.values():  # every workflow runs each of its agents on the fixed configuration's model
        expected[model] = expected.get(model, 0) + 60
    assert per_workflow["agent_calls_by_model"] == expected
    oracle = run_arm(prepared, "aragog-oracle", 6.0)
    assert oracle["workflows"] == 60
    # Every configuration the oracle allows is within the tolerance of c* on its input.
    tolerance = prepared.programs[0].input.tolerance  # type: ignore[union-attr]
    assert oracle["accuracy"] >= oracle["reference_accuracy"] - tolerance
    assert set(oracle["agent_calls_by_model"]) <= set(prepared.groups.get(aragog.GROUP).models)  # type: ignore[union-attr]
    assert oracle["routing"]["workflows"] == 60 and oracle["routing"]["cut_short_fraction"] == 0.0


def test_runs_are_deterministic(prepared: Prepared) -> None:
    assert run_arm(prepared, "aragog", 6.0) == run_arm(prepared, "aragog", 6.0)
