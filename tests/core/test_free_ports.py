"""Free ports for private stacks: bindable, disjoint, and outside the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from clairvoyant.stack import StackConfig, natsserver
from clairvoyant.stack.natsserver import free_port, free_ports

pytestmark = pytest.mark.unit


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_runs_are_bindable_disjoint_and_below_the_ephemeral_range() -> None:
    starts = free_ports(1, 3, 2)
    runs = [set(range(start, start + n)) for start, n in zip(starts, (1, 3, 2), strict=True)]
    assert sum(len(r) for r in runs) == len(set().union(*runs))  # no port in two runs
    ports = sorted(set().union(*runs))
    assert all(_bindable(port) for port in ports)
    low = natsserver._ephemeral_low()
    if low - natsserver.PRIVATE_LOW > 100:
        assert all(natsserver.PRIVATE_LOW <= port < low for port in ports)


def test_a_port_something_listens_on_is_never_picked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        taken = listener.getsockname()[1]
        # A window of six ports, the first of them taken: every pick must avoid it.
        window = tmp_path / "ip_local_port_range"
        window.write_text(f"{taken + 6}\t60999\n")
        monkeypatch.setattr(natsserver, "EPHEMERAL_RANGE_FILE", window)
        monkeypatch.setattr(natsserver, "PRIVATE_LOW", taken)
        picks = {free_port() for _ in range(50)}
        assert taken not in picks and picks <= set(range(taken + 1, taken + 6))


def test_a_private_stack_gives_every_service_and_worker_its_own_port(tmp_path: Path) -> None:
    config = StackConfig.on_free_ports(tmp_path, workers=3)
    singles = [config.gateway_port, config.gateway_grpc_port, config.scheduler_port,
               config.scheduler_metrics_port, config.profiler_port, config.profiler_metrics_port]  # fmt: skip
    workers = [config.worker_grpc_base + i for i in range(3)] + [config.worker_http_base + i for i in range(3)]
    assert len(set(singles + workers)) == 12
    assert all(_bindable(port) for port in singles + workers)
