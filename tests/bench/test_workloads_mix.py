"""Mixes: several workloads served together, one component drawn per workflow instance."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pytest

from clairvoyant.bench.cli_experiment import workload_name
from clairvoyant.bench.experiment import ExperimentConfig, build_cluster, instance
from clairvoyant.bench.workloads import get_workload
from clairvoyant.workloads.mix import MixWorkload

pytestmark = pytest.mark.unit

KAIROS = ("qa_router", "report_generate", "code_generate")


def programs(name: str, count: int, seed: int) -> list:
    workload = get_workload(name)
    rng = np.random.default_rng(seed)
    return [workload.instantiate(rng, f"wf-{i}") for i in range(count)]


def test_kairos_mix_is_its_three_applications_spelled_out() -> None:
    assert programs("kairos_mix", 30, seed=4) == programs("+".join(KAIROS), 30, seed=4)
    assert programs("kairos_mix", 30, seed=4) != programs("kairos_mix", 30, seed=5)
    mix = get_workload("kairos_mix")
    assert isinstance(mix, MixWorkload)
    assert [c.name for c in mix.components] == list(KAIROS)
    assert mix.served_models() == ["llama-3.1-8b"]


def test_each_instance_is_its_component_drawn_from_the_same_rng() -> None:
    """The contract: one rng choice picks the component, which then draws its program from the
    same rng; so the mix's program equals the component's own program given that rng state."""
    mix = get_workload("kairos_mix")
    assert isinstance(mix, MixWorkload)
    rng, replay = np.random.default_rng(9), np.random.default_rng(9)
    for i in range(20):
        program = mix.instantiate(rng, f"wf-{i}")
        component = mix.components[int(replay.choice(3, p=mix.shares))]
        assert program == component.instantiate(replay, f"wf-{i}")
        assert program.workflow_type == component.name
        program.check_integrity()


def test_components_interleave_in_equal_shares() -> None:
    drawn = [p.workflow_type for p in programs("kairos_mix", 900, seed=0)]
    counts = Counter(drawn)
    assert set(counts) == set(KAIROS)
    for name in KAIROS:  # binomial(900, 1/3): sd 14, so +-60 is > 4 sd
        assert abs(counts[name] - 300) < 60, counts
    # Interleaved, not in blocks: the first 12 instances already hold all three applications.
    assert set(drawn[:12]) == set(KAIROS)


def test_weights_set_the_shares() -> None:
    parts = [get_workload("qa_router"), get_workload("report_generate")]
    mix = MixWorkload("m", parts, weights=[3, 1])
    assert mix.shares.tolist() == [0.75, 0.25]
    rng = np.random.default_rng(1)
    drawn = Counter(mix.instantiate(rng, f"w{i}").workflow_type for i in range(800))
    assert 560 < drawn["qa_router"] < 640


def test_stats_weight_each_component_by_its_share() -> None:
    mix = get_workload("kairos_mix")
    parts = [get_workload(name).stats() for name in KAIROS]
    stats = mix.stats()
    assert stats.calls_per_workflow == pytest.approx(sum(p.calls_per_workflow for p in parts) / 3)
    assert stats.max_calls_per_workflow == max(p.max_calls_per_workflow for p in parts)
    assert stats.agents["qa_router/router"].calls_per_workflow == pytest.approx(
        parts[0].agents["router"].calls_per_workflow / 3
    )
    assert len(stats.agents) == sum(len(p.agents) for p in parts)


def test_models_are_qualified_by_component() -> None:
    mix = get_workload("kairos_mix")
    assert mix.models == {f"{name}.llm": "llama-3.1-8b" for name in KAIROS}
    other = mix.with_models({"qa_router.llm": "qwen2.5-7b"})
    assert other.served_models() == ["llama-3.1-8b", "qwen2.5-7b"]
    assert mix.served_models() == ["llama-3.1-8b"]  # a copy: the original is unchanged
    rng = np.random.default_rng(2)
    for i in range(30):
        program = other.instantiate(rng, f"wf-{i}")
        expected = "qwen2.5-7b" if program.workflow_type == "qa_router" else "llama-3.1-8b"
        assert {c.model for c in program.calls} == {expected}
    assert mix.with_models("qwen2.5-7b").served_models() == ["qwen2.5-7b"]
    with pytest.raises(ValueError, match="unknown model aliases"):
        mix.with_models({"llm": "qwen2.5-7b"})


def test_a_mix_needs_two_distinct_workloads_and_positive_weights() -> None:
    qa = get_workload("qa_router")
    with pytest.raises(ValueError, match="at least two"):
        MixWorkload("m", [qa])
    with pytest.raises(ValueError, match="appears twice"):
        MixWorkload("m", [qa, get_workload("qa_router")])
    with pytest.raises(ValueError, match="positive weight"):
        MixWorkload("m", [qa, get_workload("report_generate")], weights=[1, 0])
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        get_workload("qa_router+nope")


def test_cli_accepts_registered_names_joined_by_plus() -> None:
    assert workload_name("qa_router+code_generate") == "qa_router+code_generate"
    assert workload_name("kairos_mix") == "kairos_mix"
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload 'nope'"):
        workload_name("qa_router+nope")


def test_the_mix_runs_on_one_cluster_of_eight_replicas() -> None:
    """All three applications serve llama-3.1-8b, so 8 GPUs are 8 TP-1 replicas shared by all."""
    config = ExperimentConfig(workload="kairos_mix", gpus=8, workflows=12, concurrency=6, block_size=64)
    workload = get_workload(config.workload)
    replicas, _ = build_cluster(workload, config)
    assert [r.worker_id for r in replicas] == [f"llama-3.1-8b-{i}" for i in range(8)]
    initial, backlog = instance(workload, config)
    assert len(initial) == 6 and len(backlog) == 6
    assert {p.workflow_type for _, p in initial} | {p.workflow_type for p in backlog} == set(KAIROS)
