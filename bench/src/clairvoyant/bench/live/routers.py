"""Third-party routers as child processes: sglang-router (per model, over emulated workers) and
vllm-router (over vLLM servers).

A router is serving once a 1-token completion goes through it: both add their workers in the
background after they bind their port, so an open port is not enough.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import httpx

from clairvoyant.bench.live.prompts import ALPHABET
from clairvoyant.stack.natsserver import free_port


class RouterProcess:
    """One router listening on a free port of 127.0.0.1; ``url`` is its base URL (no ``/v1``)."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path) -> None:
        self.name = name
        self.url = f"http://127.0.0.1:{port}"
        self._log: IO[bytes] = log_path.open("ab")
        self._process = subprocess.Popen(list(argv), stdout=self._log, stderr=subprocess.STDOUT)

    def wait_serving(self, model: str, timeout_s: float = 60.0) -> None:
        """Until a 1-token completion of ``model`` goes through.  Raises RuntimeError when the
        router exits, TimeoutError when it does not serve in time."""
        deadline = time.monotonic() + timeout_s
        body = {"model": model, "prompt": ALPHABET[::-1], "max_tokens": 1, "temperature": 0.0}
        while True:
            try:
                if httpx.post(f"{self.url}/v1/completions", json=body, timeout=10.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up; see {self._log.name}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} for {model} not serving after {timeout_s:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


def sglang_router(worker_urls: Sequence[str], policy: str, log_path: Path) -> RouterProcess:
    port = free_port()
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
            "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--log-level", "warn",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    return RouterProcess("sglang-router", argv, port, log_path)


def vllm_router(worker_urls: Sequence[str], policy: str, log_path: Path) -> RouterProcess:
    """vllm-router (vllm-project/router) with ``--policy`` over the servers' own URLs.  Its
    consistent_hash policy keys on the first of x-session-id, x-user-id, ... headers, then on the
    body's ``user``; the driver sends the workflow id as x-session-id."""
    port = free_port()
    argv = [sys.executable, "-m", "vllm_router.launch_router", "--worker-urls", *worker_urls,
            "--host", "127.0.0.1", "--port", str(port), "--policy", policy, "--log-level", "warning",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip
    return RouterProcess("vllm-router", argv, port, log_path)
