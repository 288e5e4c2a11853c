"""compare --own-stacks: each preset runs with the cache and scaling policies its preset names."""

from __future__ import annotations

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, stack_config

pytestmark = pytest.mark.unit

BASE = ExperimentConfig(workload="react_bfcl", gpus=2, host_cache="auto", own_stacks=True)


@pytest.mark.parametrize(
    ("preset", "cache", "scaling"),
    [("vllm-prodstack", "lmcache", None), ("sglang-gw", "hicache", None), ("saga", "saga", None),
     ("pythia", "pythia", "pythia"), ("clairvoyant", "pythia", None), ("fcfs-rr", "lru", None)],
)  # fmt: skip
def test_each_preset_gets_its_own_cache_and_scaling_policy(preset: str, cache: str, scaling: str | None) -> None:
    config = stack_config(BASE, preset)
    assert (config.cache_policy, config.scaling) == (cache, scaling)
    assert config.host_cache == "auto" and config.gpus == 2  # the rest is the config's


def test_without_own_stacks_the_config_is_used_as_given() -> None:
    given = ExperimentConfig(workload="react_bfcl", cache_policy="kvflow")
    assert stack_config(given, "pythia") is given


@pytest.mark.parametrize(
    "extra",
    [["--cache-policy", "lru"], ["--scaling", "reactive"], ["--scalings", "static,reactive"], ["--mode", "live"]],
)
def test_own_stacks_refuses_a_policy_given_for_every_preset(extra: list[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["compare", "--workload", "react_bfcl", "--policies", "pythia", "--own-stacks", "--out",
            str(tmp_path / "x.json"), *extra]  # fmt: skip
    with pytest.raises(SystemExit, match="--own-stacks"):
        main(args)
    assert not (tmp_path / "x.json").exists()
