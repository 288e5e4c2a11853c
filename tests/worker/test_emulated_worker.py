"""A real worker process with ``--runner emulated`` serves like any other, in emulated GPU time.

NATS points at a port where nothing listens: the worker must degrade (no heartbeats), not fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from clairvoyant.stack.natsserver import free_port
from clairvoyant.worker.costmodel.gpus import H100_80G
from clairvoyant.worker.costmodel.models import LLAMA_31_8B
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MAX_TOKENS = 150


def _wait_http(url: str, timeout: float, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@pytest.fixture
def worker_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "CV_NATS_URL": f"nats://127.0.0.1:{free_port()}", "CV_NATS_CONNECT_TIMEOUT_S": "0.5"}
    args = [sys.executable, "-m", "clairvoyant.worker", "--runner", "emulated", "--gpu", "H100-80G",
            "--model", "llama-3.1-8b", "--grpc-port", str(free_port()), "--http-port", str(port),
            "--worker-id", "emulated-test"]
    log = tmp_path / "worker.log"
    process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 60, process, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def test_emulated_worker_serves_llama_8b_in_h100_time(worker_url: str) -> None:
    models = httpx.get(f"{worker_url}/v1/models", timeout=5).json()
    assert [card["id"] for card in models["data"]] == ["llama-3.1-8b"]
    cost = CostModel(H100_80G, LLAMA_31_8B)
    info = httpx.get(f"{worker_url}/get_server_info", timeout=5).json()
    assert info["max_total_num_tokens"] == cost.kv_capacity_tokens(0.9) // 16 * 16  # sized from GPU memory

    body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Plan the refactor."}],
            "max_tokens": MAX_TOKENS}
    start = time.monotonic()
    reply = httpx.post(f"{worker_url}/v1/chat/completions", json=body, timeout=60)
    wall = time.monotonic() - start
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert data["usage"]["completion_tokens"] == MAX_TOKENS
    assert data["choices"][0]["message"]["content"] == "x" * MAX_TOKENS
    assert data["choices"][0]["finish_reason"] == "length"

    prompt = data["usage"]["prompt_tokens"]
    predicted = cost.step_cost([BatchItem(prompt)]).seconds + sum(
        cost.step_cost([BatchItem(1, prompt + k)]).seconds for k in range(MAX_TOKENS - 1)
    )
    assert 0.5 < predicted < 2.0  # ~6.3 ms per decode step on an H100
    assert wall >= predicted
