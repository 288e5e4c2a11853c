"""``live-compare --engine vllm``: what the driver sends to a session-affinity router, vLLM's counters
as read from ``/metrics``, ratios against vllm-router-rr, and (e2e, vLLM) the four arms run one
instance on one fleet of workers fronting a real vLLM server."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
from pathlib import Path
from typing import Any

import httpx2
import numpy as np
import openai
import pytest

from clairvoyant.bench.__main__ import main
from clairvoyant.bench.experiment import ExperimentConfig, instance
from clairvoyant.bench.live.compare import BASELINE, VLLM_BASELINE, comparison
from clairvoyant.bench.live.driver import LiveDriver, cap_output
from clairvoyant.bench.live.vllm_fleet import (
    ROUTER_POLICIES,
    SERVED_MODEL,
    SESSION_HEADER,
    EngineCounters,
    vllm_installed,
    vllm_worker_specs,
)
from clairvoyant.bench.workloads import get_workload

METRICS_PAGE = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-135m-instruct"} 90.0
vllm:prefix_cache_hits_total{engine="1",model_name="smollm2-135m-instruct"} 6.0
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m-instruct"} 160.0
vllm:num_preemptions_total{engine="0",model_name="smollm2-135m-instruct"} 2.0
vllm:prefix_cache_hits_created{engine="0",model_name="smollm2-135m-instruct"} 1.7e9
"""


@pytest.mark.unit
def test_the_driver_sends_the_workflow_id_as_a_session_header_and_names_the_served_model() -> None:
    program = get_workload("react_bfcl").instantiate(np.random.default_rng(4), "wf-00000")
    program = cap_output(program, 3)
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        seen.append((request.headers.get(SESSION_HEADER, ""), body))
        usage = {"prompt_tokens": 5, "completion_tokens": body["max_tokens"], "total_tokens": 5 + body["max_tokens"]}
        chunks = [
            {"id": f"cmpl-{len(seen)}", "object": "text_completion", "created": 0, "model": body["model"],
             "choices": [{"index": 0, "text": "ab", "finish_reason": None}]},
            {"id": f"cmpl-{len(seen)}", "object": "text_completion", "created": 0, "model": body["model"],
             "choices": [], "usage": usage},
        ]  # fmt: skip
        sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=sse.encode())

    async def run() -> None:
        # The SDK's own HTTP client, answered in process (a router's streamed replies).
        http = openai.DefaultAsyncHttpxClient(transport=httpx2.MockTransport(handler))
        async with openai.AsyncOpenAI(base_url="http://router/v1", api_key="none", http_client=http) as client:
            driver = LiveDriver(client, {}, run_tag="t1", session_header=SESSION_HEADER, served_model=SERVED_MODEL)
            records = await driver.run([(0.0, program)])
            assert [w.end_time is not None for w in records.workflows] == [True]

    asyncio.run(run())
    assert len(seen) == len(program.calls) > 1
    assert {header for header, _ in seen} == {"wf-00000@t1"}
    assert {body["model"] for _, body in seen} == {SERVED_MODEL}
    assert sorted(body["max_tokens"] for _, body in seen) == sorted(min(c.output_tokens, 3) for c in program.calls)
    assert all(body["ignore_eos"] and body["app_metadata"]["workflow_id"] == "wf-00000@t1" for _, body in seen)


@pytest.mark.unit
def test_vllm_counters_are_summed_over_label_sets_and_servers_and_differenced() -> None:
    one = EngineCounters.parse(METRICS_PAGE)
    assert one == EngineCounters(prefix_cache_hits=96.0, prefix_cache_queries=160.0, preemptions=2.0)
    both = one + EngineCounters(4.0, 160.0, 2.0)  # a second server
    assert both == EngineCounters(100.0, 320.0, 4.0)
    delta = both.since(EngineCounters(0.0, 120.0, 1.0))
    assert (delta.prefix_cache_hits, delta.prefix_cache_queries, delta.preemptions) == (100.0, 200.0, 3.0)
    assert delta.hit_rate == 0.5
    assert EngineCounters(0.0, 0.0, 0.0).hit_rate == 0.0


@pytest.mark.unit
def test_vllm_workers_get_one_core_each_and_one_gib_of_kv(tmp_path: Path) -> None:
    specs = vllm_worker_specs(3, 4, tmp_path)
    cores = os.cpu_count() or 1
    assert [s.worker_id for s in specs] == ["vllm-0", "vllm-1", "vllm-2"]
    assert {s.model for s in specs} == {SERVED_MODEL}
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in specs] == [str(i % cores) for i in range(3)]
    assert all(s.env["CV_ENGINE"] == "vllm" and s.env["CV_MAX_NUM_SEQS"] == "4" for s in specs)
    assert all(s.env["CV_KV_CACHE_MB"] == "1024" for s in specs)
    assert len({s.env["CV_ENGINE_LOG"] for s in specs}) == 3


def _metrics(jct: float, tok_s: float, hit: float) -> dict[str, Any]:
    return {
        "avg_jct_s": jct, "p50_jct_s": jct, "p95_jct_s": 2 * jct, "throughput_tok_s": tok_s,
        "workflows_per_min": 1.0, "ttft_p50_s": 0.1, "ttft_p99_s": 0.3, "preemptions": 0,
        "prefix_cache_hit_rate": hit, "replicas": {"vllm-0": SERVED_MODEL}, "live": {"warnings": []},
    }  # fmt: skip


@pytest.mark.unit
def test_vllm_ratios_are_against_vllm_router_rr_of_the_same_run() -> None:
    args = argparse.Namespace(preset="clairvoyant", time_scale=1.0, max_num_seqs=8, max_tokens=None)
    config = ExperimentConfig(workload="react_bfcl", gpus=2, workflows=4, concurrency=2)
    results = {
        VLLM_BASELINE: _metrics(10.0, 100.0, 0.5), "vllm-router-session": _metrics(8.0, 110.0, 0.8),
        BASELINE: _metrics(12.0, 90.0, 0.5), "clairvoyant": _metrics(5.0, 125.0, 0.8),
    }  # fmt: skip
    result = comparison(config, args, results, engine="vllm")
    assert result.name == "live-vllm-react_bfcl-c2"
    assert "prefix hit" in result.columns and result.columns[-5] == f"avg_jct_s / {VLLM_BASELINE}"
    rows = {row[0]: row for row in result.rows}
    assert rows[VLLM_BASELINE][-5:] == [1.0] * 5
    assert rows["clairvoyant"][-5:-2] == pytest.approx([0.5, 0.5, 1.25])
    assert rows["clairvoyant"][result.columns.index("prefix hit")] == 0.8
    assert result.summary["clairvoyant_avg_jct_s_vs_vllm-router-rr"] == pytest.approx(0.5)
    assert result.params["engine"] == "vllm" and result.params["served_model"] == SERVED_MODEL
    without_baseline = comparison(config, args, {BASELINE: results[BASELINE]}, engine="vllm")
    assert all(math.isnan(v) for v in without_baseline.rows[0][-5:])


@pytest.mark.e2e
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_four_arms_run_one_instance_on_one_vllm_fleet(tmp_path: Path) -> None:
    if not vllm_installed():
        message = "vLLM is not installed (var/vllm-venv, var/models/smollm2-135m-instruct): run make install-vllm"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if os.environ.get("CI") is None:
        pytest.importorskip("vllm_router")
    args = ["--out-dir", str(tmp_path), "live-compare", "--engine", "vllm", "--workers", "1", "--workflows", "2",
            "--concurrency", "2", "--max-tokens", "6", "--seed", "5"]  # fmt: skip
    assert main(args) == 0
    saved = json.loads((tmp_path / "live-vllm-react_bfcl-c2.json").read_text())
    per_arm = saved["params"]["per_arm"]
    arms = [*ROUTER_POLICIES, BASELINE, "clairvoyant"]
    assert list(per_arm) == arms
    config = ExperimentConfig(workload="react_bfcl", workflows=2, concurrency=2, seed=5)
    arrivals, backlog = instance(get_workload("react_bfcl"), config)
    programs = [p for _, p in arrivals] + list(backlog)
    calls = sum(len(p.calls) for p in programs)
    output_tokens = sum(min(c.output_tokens, 6) for p in programs for c in p.calls)
    for arm, result in per_arm.items():
        assert (result["workflows"], result["calls"]) == (2, calls), arm
        assert result["live"]["generated_tokens"] == output_tokens, arm  # ignore_eos and the cap: exact
        assert result["live"]["calls_without_usage"] == 0, arm  # vLLM reports usage on either path
        assert result["avg_jct_s"] > 0 and result["p95_jct_s"] >= result["avg_jct_s"] * 0.5, arm
        assert result["throughput_tok_s"] > 0, arm
        cache = result["vllm_prefix_cache"]
        # A react_bfcl call repeats its workflow's earlier context: vLLM finds some of it cached.
        assert 0 < cache["hits"] <= cache["queries"] == result["live"]["prompt_tokens"], arm
        assert result["prefix_cache_hit_rate"] == pytest.approx(cache["hits"] / cache["queries"], abs=1e-3)
    assert len({result["live"]["prompt_seed"] for result in per_arm.values()}) == 4
    columns = saved["columns"]
    rows = {row[0]: row for row in saved["rows"]}
    baseline = per_arm[VLLM_BASELINE]
    for arm in arms:
        for key in ("avg_jct_s", "p95_jct_s", "throughput_tok_s"):
            ratio = rows[arm][columns.index(f"{key} / {VLLM_BASELINE}")]
            assert ratio == pytest.approx(per_arm[arm][key] / baseline[key], abs=2e-3), (arm, key)
    assert rows[VLLM_BASELINE][-5:] == [1.0] * 5
