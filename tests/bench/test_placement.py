"""Workload-aware placement: the pure allocation (budget, proportion, one replica each, errors),
the workload's predicted demand, and ``--placement auto`` through the cluster and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import (
    ExperimentConfig,
    _efficient_batch,
    _runner,
    build_cluster,
    plan_placement,
    run_sim,
)
from clairvoyant.bench.sim.placement import ModelDemand, ShapeCost, place, predicted_demand
from clairvoyant.bench.workloads import get_workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(300)]


def _demand(model: str, gpu_seconds: float, *tps: int) -> ModelDemand:
    return ModelDemand(model, tuple(ShapeCost(tp, (gpu_seconds,)) for tp in tps or (1,)))


@pytest.mark.parametrize(
    ("work", "budget"),
    [((3.0, 1.0), 8), ((1.0, 1.0), 8), ((10.0, 1.0, 1.0), 7), ((5.0, 2.0, 0.0), 16), ((1.0, 4.0), 3)],
)
def test_auto_follows_the_load_within_one_replica_and_never_exceeds_the_budget(
    work: tuple[float, ...], budget: int
) -> None:
    demands = [_demand(f"m{i}", w) for i, w in enumerate(work)]
    placement = place(demands, budget)
    assert placement.gpus == budget  # one-GPU replicas: every GPU placed
    for i, w in enumerate(work):
        replicas = placement.replicas[f"m{i}"]
        assert replicas >= 1
        assert abs(replicas - budget * w / sum(work)) <= 1.0 + 1e-9


def test_three_to_one_on_eight_gpus_is_six_and_two() -> None:
    placement = place([_demand("big", 3.0), _demand("small", 1.0)], 8)
    assert placement.replicas == {"big": 6, "small": 2}
    assert placement.tp == {"big": 1, "small": 1}


def test_wide_replicas_stay_within_the_budget_and_leftovers_go_where_they_fit() -> None:
    # A 4-GPU model with 90 % of the work and a 1-GPU one: 4 + 4 x 1 on 8 GPUs, and on 11 GPUs
    # the 4-GPU model takes a second replica before the small one its spare GPUs.
    assert place([_demand("wide", 9.0, 4), _demand("narrow", 1.0)], 8).replicas == {"wide": 1, "narrow": 4}
    eleven = place([_demand("wide", 9.0, 4), _demand("narrow", 1.0)], 11)
    assert eleven.replicas == {"wide": 2, "narrow": 3} and eleven.gpus == 11


def test_the_cheapest_degree_is_chosen_unless_a_smaller_one_is_close() -> None:
    far = ModelDemand("m", (ShapeCost(1, (10.0,)), ShapeCost(2, (6.0,))))
    close = ModelDemand("m", (ShapeCost(1, (10.0,)), ShapeCost(2, (9.8,))))
    assert place([far], 8).tp == {"m": 2} and place([far], 8).replicas == {"m": 4}
    assert place([close], 8).tp == {"m": 1} and place([close], 8).replicas == {"m": 8}
    # Too few GPUs for the cheapest degrees of both: each falls back to its smallest.
    both = place([far, ModelDemand("n", (ShapeCost(1, (5.0,)), ShapeCost(2, (1.0,))))], 3)
    assert both.tp == {"m": 1, "n": 1} and both.gpus == 3


@pytest.mark.parametrize(
    ("demands", "budget", "message"),
    [
        (
            [_demand("a", 1.0), _demand("b", 1.0), _demand("c", 1.0)],
            2,
            "budget of 2 GPUs cannot give each of 3",
        ),
        ([_demand("a", 1.0, 4), _demand("b", 1.0, 4)], 6, "below one replica of each model"),
        ([], 4, "at least one model"),
        ([_demand("a", 1.0), _demand("a", 2.0)], 4, "named twice"),
        ([ModelDemand("a", ())], 4, "no replica shape"),
        ([_demand("a", -1.0)], 4, "bad shape"),
    ],
)
def test_bad_input_is_refused_naming_it(demands: list[ModelDemand], budget: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        place(demands, budget)


def test_work_that_grows_as_batches_shrink_draws_more_replicas() -> None:
    # Both bring 4 GPU-seconds at a full batch; the second's calls are few at a time, so each
    # replica past the first runs a smaller batch and its work grows: it gets the larger share.
    steady = ModelDemand("steady", (ShapeCost(1, (4.0,)),))
    sparse = ModelDemand("sparse", (ShapeCost(1, (4.0, 5.0, 6.0, 7.0, 8.0)),))
    assert place([steady, ModelDemand("flat", (ShapeCost(1, (4.0,)),))], 8).replicas == {
        "steady": 4,
        "flat": 4,
    }
    placement = place([steady, sparse], 8)
    assert placement.replicas == {"steady": 3, "sparse": 5}
    assert placement.gpu_seconds == {"steady": 4.0, "sparse": 8.0}  # the work at the batch 5 replicas run


def test_the_load_sets_the_batch_demand_is_priced_at() -> None:
    workload = get_workload("coding_assistant")
    rng = np.random.default_rng(0)
    programs = [workload.instantiate(rng, f"p-{i}") for i in range(16)]
    config = ExperimentConfig(workload="coding_assistant")
    shapes = {
        model: [_efficient_batch(_runner(model, "H100-80G")[0], config)] for model in workload.served_models()
    }
    full = {d.model: d.shapes[0] for d in predicted_demand(programs, shapes)}
    light = {
        d.model: d.shapes[0]
        for d in predicted_demand(programs, shapes, workflows_in_flight=4, max_replicas=4)
    }
    heavy = {
        d.model: d.shapes[0]
        for d in predicted_demand(programs, shapes, workflows_in_flight=1e5, max_replicas=4)
    }
    for model in shapes:
        assert len(full[model].gpu_seconds) == 1 and len(light[model].gpu_seconds) == 4
        assert heavy[model].gpu_seconds == pytest.approx((full[model].work(1),) * 4)  # every batch full
        works = light[model].gpu_seconds
        assert full[model].work(1) < works[0] and list(works) == sorted(works)  # fewer calls each: dearer
    with pytest.raises(ValueError, match="max_replicas must be >= 1, got 0"):
        predicted_demand(programs, shapes, workflows_in_flight=4, max_replicas=0)


def test_a_full_batch_is_what_the_seats_or_the_pool_allow() -> None:
    shape = _efficient_batch(
        _runner("qwen2.5-14b", "H100-80G")[0], ExperimentConfig(workload="coding_assistant")
    )
    assert shape.seats == 256 and shape.kv_tokens > 100_000
    assert shape.full_batch(1000) == min(256, shape.kv_tokens // 1000)
    assert shape.full_batch(10) == 256 and shape.full_batch(10**9) == 1


def test_the_workloads_demand_sets_the_split() -> None:
    """coding_assistant: the 7B code model's explorers and engineers bring it more GPU-seconds
    than the 14B reasoning model gets, so auto gives it more replicas; equal splits 4 + 4."""
    workload = get_workload("coding_assistant")
    auto = plan_placement(workload, ExperimentConfig(workload="coding_assistant", gpus=8, placement="auto"))
    equal = plan_placement(workload, ExperimentConfig(workload="coding_assistant", gpus=8))
    assert equal.replicas == {"qwen2.5-14b": 4, "qwen2.5-7b": 4}
    work = auto.gpu_seconds
    assert work["qwen2.5-7b"] > work["qwen2.5-14b"] > 0
    assert auto.gpus == 8 and auto.replicas["qwen2.5-7b"] > auto.replicas["qwen2.5-14b"] >= 1
    for model, replicas in auto.replicas.items():
        assert abs(replicas * auto.tp[model] - 8 * work[model] / sum(work.values())) <= auto.tp[model]
    cluster, _ = build_cluster(
        workload, ExperimentConfig(workload="coding_assistant", gpus=8, placement="auto")
    )
    assert sorted(spec.worker_id for spec in cluster) == sorted(
        f"{model}-{i}" for model, count in auto.replicas.items() for i in range(count)
    )


def test_a_model_no_agent_calls_keeps_one_replica() -> None:
    # self_refine serves three sizes; only the 32B one is called (the others are alternatives).
    auto = plan_placement(
        get_workload("self_refine"), ExperimentConfig(workload="self_refine", placement="auto")
    )
    assert set(auto.replicas) == {"qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b"}
    assert min(auto.replicas.values()) >= 1 and auto.gpus <= 8
    assert auto.replicas["qwen2.5-32b"] * auto.tp["qwen2.5-32b"] == auto.gpus - 2


def test_unknown_placement_is_refused() -> None:
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=2, placement="greedy")
    with pytest.raises(ValueError, match="unknown placement 'greedy'; choose from equal, auto"):
        run_sim(config, "fcfs-rr")


def test_a_small_run_with_auto_placement_completes_and_records_it(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code = main(["run", "--workload", "deep_research", "--policy", "fcfs-rr", "--gpus", "4", "--workflows", "6",
                 "--concurrency", "3", "--placement", "auto", "--out", str(out)])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert result["config"]["placement"] == "auto"
    metrics = result["policies"]["fcfs-rr"]
    assert metrics["workflows"] == 6
    placed = metrics["placement"]
    assert sum(entry["replicas"] * entry["tp"] for entry in placed.values()) <= 4
    assert len(metrics["replicas"]) == sum(entry["replicas"] for entry in placed.values())
    # The default leaves the file as it was: no placement key.
    code = main(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--gpus", "2", "--workflows", "2",
                 "--rate", "1", "--out", str(out)])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert "placement" not in result["config"] and "placement" not in result["policies"]["fcfs-rr"]


def test_the_cli_refuses_an_unknown_placement(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--placement", "random",
              "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert "invalid choice: 'random'" in capsys.readouterr().err
