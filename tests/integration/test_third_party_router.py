"""sglang-router (from PyPI) fronts our workers' HTTP endpoints as a live baseline.

The router probes the workers (/health, /get_server_info, /get_model_info) before it routes to
them, so a completed request through it shows that our worker speaks what third-party routers
expect.  The worker runs with no NATS server at all: it must degrade, not fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from clairvoyant.stack.natsserver import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


def _wait_http(url: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
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
    env = {**os.environ, "CV_MODEL": "tiny-random", "CV_WORKER_ID": "router-test", "CV_TORCH_THREADS": "1",
           "CV_WORKER_GRPC_PORT": str(free_port()), "CV_WORKER_HTTP_PORT": str(port),
           "CV_NATS_URL": f"nats://127.0.0.1:{free_port()}"}  # nothing listens there
    process = subprocess.Popen([sys.executable, "-m", "clairvoyant.worker"], env=env,
                               stdout=subprocess.DEVNULL, stderr=(tmp_path / "worker.log").open("wb"))
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 60, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


def _ok_requests(worker_url: str) -> float:
    text = httpx.get(f"{worker_url}/metrics", timeout=5).text
    match = re.search(r'^cv_worker_requests_total\{status="ok"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_sglang_router_fronts_a_worker(worker_url: str, tmp_path: Path) -> None:
    pytest.importorskip("sglang_router")
    port = free_port()
    args = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", worker_url,
            "--port", str(port), "--host", "127.0.0.1", "--policy", "round_robin",
            "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1"]
    log = (tmp_path / "router.log").open("wb")
    router = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", 30, router)
        before = _ok_requests(worker_url)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
        reply = None
        deadline = time.monotonic() + 30
        while reply is None:  # the router registers workers in the background after it starts
            try:
                reply = client.chat.completions.create(
                    model="tiny-random", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                    temperature=0, extra_body={"ignore_eos": True},
                )
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert reply.usage is not None and reply.usage.completion_tokens == 6
        assert reply.choices[0].finish_reason == "length"
        assert _ok_requests(worker_url) == before + 1
    finally:
        router.terminate()
        router.wait(10)
        log.close()
        if router.returncode not in (0, -15) and shutil.which("cat"):
            print((tmp_path / "router.log").read_text()[-3000:])
