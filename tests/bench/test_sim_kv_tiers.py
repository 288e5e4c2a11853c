"""KV tiers in the simulator: hit ratio by tier, prefill tokens saved, and the defaults change nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from clairvoyant.bench.experiment import (
    ExperimentConfig,
    check_tiers,
    config_dict,
    replica_spec,
    shared_l3,
)
from clairvoyant.bench.metrics import summarize
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, CallSegment, NewSegment, WorkflowProgram

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MODEL = "qwen2.5-14b"
CONTEXT = 2000  # each workflow's own context, read again by its second call
WORKFLOWS = 10
# One qwen2.5-14b replica on an H100, its L1 cut to 400 blocks (6,400 tokens: the contexts of three
# workflows), so most contexts are evicted while their workflows wait for their tools.  The L2 of
# 1.5 GB (~475 blocks) holds three more; the shared L3 holds them all.
L1_BLOCKS = 400
BASE = ExperimentConfig(workload="coding_assistant", gpus=1, workflows=WORKFLOWS, seed=3)
SETUPS = {
    "l1": {},
    "l1+l2": {"host_cache": "1.5"},
    "l1+l2+l3": {"host_cache": "1.5", "l3": "memory"},
}


def workflow(i: int) -> WorkflowProgram:
    """Read a fresh context, call a tool, then read the context again with 100 new tokens.  The
    tools of later workflows are shorter: the contexts are read again last in, first out, so the
    most recent ones are still in L1, the next ones in L2, and the oldest only in L3."""
    wf = f"wf{i}"
    first = Call(f"{wf}/0", 0, "agent", MODEL, (NewSegment("new", CONTEXT),), CONTEXT, 16, (),
                 tool="search", tool_latency_s=60.0 - 6.0 * i)  # fmt: skip
    second = Call(f"{wf}/1", 1, "agent", MODEL, (CallSegment("call", first.call_id, "prompt", CONTEXT),
                  NewSegment("new", 100)), CONTEXT + 100, 16, (first.call_id,))  # fmt: skip
    return WorkflowProgram("tiers", wf, (first, second))


def simulate(**tiers: Any) -> dict[str, Any]:
    config = dataclasses.replace(BASE, **tiers)
    check_tiers(config)
    runner = EmulatedRunner(MODEL, config.gpu, 1, sleep=lambda seconds: None, distinct_tokens=True)
    spec = replica_spec("r0", runner, config, shared_l3([runner], config))
    spec = dataclasses.replace(spec, config=dataclasses.replace(spec.config, num_blocks=L1_BLOCKS))
    arrivals = [(3.0 * i, workflow(i)) for i in range(WORKFLOWS)]
    return summarize(Simulator([spec], "fcfs-rr").run(arrivals))


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    return {name: simulate(**tiers) for name, tiers in SETUPS.items()}


def total_hit_ratio(metrics: dict[str, Any]) -> float:
    return float(sum(metrics["kv_tiers"]["hit_ratio"].values()))


def test_each_tier_below_l1_raises_the_hit_ratio(results: dict[str, dict[str, Any]]) -> None:
    l1, l2, l3 = (total_hit_ratio(results[name]) for name in SETUPS)
    assert l1 < l2 < l3
    assert results["l1+l2"]["kv_tiers"]["hit_ratio"]["l2"] > 0
    assert results["l1+l2+l3"]["kv_tiers"]["hit_ratio"]["l3"] > 0


def test_l3_hits_only_with_an_l3(results: dict[str, dict[str, Any]]) -> None:
    for name in ("l1", "l1+l2"):
        assert results[name]["kv_tiers"]["hit_tokens"]["l3"] == 0
        assert results[name]["kv_tiers"]["l3_written_blocks"] == 0
    assert results["l1"]["kv_tiers"]["hit_tokens"]["l2"] == 0
    assert results["l1"]["kv_tiers"]["demoted_blocks"] == 0


def test_prefill_tokens_saved_are_the_tier_hits(results: dict[str, dict[str, Any]]) -> None:
    for metrics in results.values():
        tiers = metrics["kv_tiers"]
        assert metrics["preemptions"] == 0  # each call admitted once: the engines' and the calls' counts agree
        assert tiers["prefill_tokens_saved"] == sum(tiers["hit_tokens"].values()) > 0
    prompts = {metrics["kv_tiers"]["prompt_tokens"] for metrics in results.values()}
    assert len(prompts) == 1  # the same calls in every setup


def test_l1_alone_reports_the_calls_cache_hits(results: dict[str, dict[str, Any]]) -> None:
    """Without tiers every hit is an L1 hit, and it is the per-call cache hit ratio."""
    metrics = results["l1"]
    assert metrics["kv_tiers"]["hit_ratio"]["l1"] == pytest.approx(metrics["cache_hit_ratio"])


def test_the_tier_keys_stay_out_of_a_default_config() -> None:
    assert not {"host_cache", "l3", "l3_capacity_gb", "l3_write_policy"} & set(config_dict(BASE))
    assert config_dict(dataclasses.replace(BASE, host_cache="auto"))["host_cache"] == "auto"


@pytest.mark.parametrize(
    "tiers",
    [{"host_cache": "-1"}, {"host_cache": "lots"}, {"l3": "memory"}, {"host_cache": "1", "l3": "redis"},
     {"host_cache": "1", "l3_capacity_gb": 0.0}, {"host_cache": "1", "l3_write_policy": "sometimes"}],
)  # fmt: skip
def test_bad_tier_options_are_refused(tiers: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        check_tiers(dataclasses.replace(BASE, **tiers))
