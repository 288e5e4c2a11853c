"""Scheduler fixtures: nats-servers on chosen ports (a test starts one late, after the scheduler)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clairvoyant.stack.natsserver import NatsServer
from clairvoyant.stack.natsserver import free_port as _free_port


def free_port() -> int:
    return _free_port()


@pytest.fixture
def nats_server_factory(tmp_path: Path) -> Iterator[Callable[[int], str]]:
    """Starts nats-servers (JetStream on, store under tmp_path) on given ports; stops them after."""
    servers: list[NatsServer] = []

    def start(port: int) -> str:
        server = NatsServer(tmp_path / f"nats-js-{port}", port=port).start()
        servers.append(server)
        return server.url

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def nats_server(nats_server_factory: Callable[[int], str]) -> str:
    """A fresh nats-server with JetStream on a free port (one per test); the value is its URL."""
    return nats_server_factory(free_port())
