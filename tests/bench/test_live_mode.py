"""``--mode live`` against a real stack: two emulated llama-3.1-8b workers on H100-80G, fcfs-rr.

The emulated workers tokenize bytes, so prompt and output lengths are exact and the reported
token totals must equal the programs' own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, instance
from clairvoyant.bench.workloads import get_workload
from clairvoyant.stack import Stack, StackConfig
from clairvoyant.stack.natsserver import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WORKFLOWS, CONCURRENCY, SEED, TIME_SCALE = 6, 3, 5, 0.5


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("live-stack")
    config = StackConfig.on_free_ports(
        var,
        model="llama-3.1-8b",
        workers=2,
        policy="fcfs-rr",
        # The simulator's replica settings (experiment.ExperimentConfig defaults).
        worker_env={"CV_RUNNER": "emulated", "CV_GPU": "H100-80G", "CV_MAX_NUM_SEQS": "256",
                    "CV_MAX_NUM_BATCHED_TOKENS": "8192", "CV_TORCH_THREADS": "1"},
    )  # fmt: skip
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()


def _live_args(stack: Stack, out: Path, *extra: str) -> list[str]:
    return [
        "--mode", "live", "--gpus", "2", "--workflows", str(WORKFLOWS), "--concurrency", str(CONCURRENCY),
        "--seed", str(SEED), "--time-scale", str(TIME_SCALE), "--base-url", f"{stack.gateway_url}/v1",
        "--scheduler", stack.scheduler_address, "--out", str(out), *extra,
    ]  # fmt: skip


def test_live_run_reports_the_programs_exactly(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    assert main(["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", *_live_args(stack, out)]) == 0
    result = json.loads(out.read_text())
    assert {"workload", "mode", "seed", "wall_seconds", "policies"} <= set(result)
    assert (result["workload"], result["mode"], result["seed"]) == ("react_bfcl", "live", SEED)
    assert list(result["policies"]) == ["fcfs-rr"]
    metrics = result["policies"]["fcfs-rr"]

    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=WORKFLOWS, concurrency=CONCURRENCY, seed=SEED)
    arrivals, backlog = instance(get_workload("react_bfcl"), config)
    programs = [p for _, p in arrivals] + backlog
    assert metrics["workflows"] == WORKFLOWS
    assert metrics["calls"] == sum(len(p) for p in programs)
    live = metrics["live"]
    # ignore_eos + max_tokens: every output is exactly as long as the workload says; byte prompts too.
    assert live["generated_tokens"] == sum(p.total_output_tokens for p in programs)
    assert live["prompt_tokens"] == sum(p.total_prompt_tokens for p in programs)
    assert live["prompt_length_mismatches"] == 0
    assert live["policy_source"] == "scheduler" and live["time_scale"] == TIME_SCALE
    assert live["warnings"] == []  # two workers = the two replicas --gpus 2 simulates
    assert sorted(metrics["replicas"]) == ["worker-1", "worker-2"]

    assert len(metrics["jct_s"]) == len(live["lower_bound_s"]) == WORKFLOWS
    for jct, bound in zip(metrics["jct_s"], live["lower_bound_s"], strict=True):
        assert 0 < bound <= jct
    assert metrics["distance_from_limit"] >= 1.0
    assert metrics["slo_attainment"]["10x"] == 1.0  # a light load: every workflow within 10x its bound
    # Each ReAct step re-sends the previous prompt and reply: most prompt tokens are cache hits.
    assert 0.5 < metrics["cache_hit_ratio"] < 1.0
    assert metrics["preemptions"] == 0 and live["preemptions_read"]
    assert metrics["throughput_tok_s"] == pytest.approx(live["generated_tokens"] / metrics["duration_s"])
    assert set(metrics["ttft_s_by_agent"]) == {"react"} and metrics["ttft_s_by_agent"]["react"] > 0


@pytest.mark.parametrize(
    ("policies", "message"),
    [("least-loaded", "the stack's scheduler runs 'fcfs-rr', not 'least-loaded'"),
     ("fcfs-rr,least-loaded", "2 policies given (it runs 'fcfs-rr')")],
)  # fmt: skip
def test_a_policy_the_stack_does_not_run_is_a_clear_error(
    stack: Stack, tmp_path: Path, policies: str, message: str
) -> None:
    out = tmp_path / "compare.json"
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--workload", "react_bfcl", "--policies", policies, *_live_args(stack, out)])
    assert message in str(exc.value.code) and "CV_POLICY" in str(exc.value.code)
    assert not out.exists()


def test_a_model_the_stack_does_not_serve_is_a_clear_error(stack: Stack, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--workload", "swe_agent", "--policy", "fcfs-rr", *_live_args(stack, tmp_path / "x.json")])
    assert "needs model(s) ['llama-3.1-70b'] but the gateway serves ['llama-3.1-8b']" in str(exc.value.code)


def test_an_unreachable_gateway_is_a_clear_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = ["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--mode", "live", "--workflows", "1",
            "--base-url", url, "--out", str(tmp_path / "x.json")]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert f"cannot reach the gateway at {url}" in str(exc.value.code)


def test_live_run_follows_an_arrival_process_given_as_text(stack: Stack, tmp_path: Path) -> None:
    """``--arrivals``: two cron batches of three, 4 s apart; the second waits its turn in real time."""
    out = tmp_path / "cron.json"
    args = ["run", "--workload", "react_bfcl", "--policy", "fcfs-rr", "--mode", "live", "--gpus", "2",
            "--workflows", "6", "--arrivals", "cron:period_s=4,batch=3", "--seed", str(SEED),
            "--time-scale", "0.1", "--base-url", f"{stack.gateway_url}/v1", "--scheduler", stack.scheduler_address,
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    result = json.loads(out.read_text())
    metrics = result["policies"]["fcfs-rr"]
    assert result["config"]["arrivals"] == "cron:period_s=4,batch=3"
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=6, seed=SEED, arrivals="cron:period_s=4,batch=3")
    arrivals, backlog = instance(get_workload("react_bfcl"), config)
    assert [t for t, _ in arrivals] == [0.0, 0.0, 0.0, 4.0, 4.0, 4.0] and backlog == []
    assert metrics["workflows"] == 6 and metrics["calls"] == sum(len(p) for _, p in arrivals)
    # JCTs are in arrival order: the second batch's workflows ran from 4 s after the first arrival.
    second_batch = metrics["jct_s"][3:]
    assert metrics["duration_s"] >= 4.0 + max(second_batch) - 1e-6, (metrics["duration_s"], metrics["jct_s"])
