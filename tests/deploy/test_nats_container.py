"""Smoke test of the NATS image docker-compose.yml runs: JetStream takes a record and gives it back.

Needs a Docker engine (testcontainers starts the container); where none answers it skips at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import yaml

from clairvoyant.core.bus import EventBus

pytestmark = pytest.mark.integration

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def compose_nats_image() -> str:
    return str(yaml.safe_load(COMPOSE.read_text())["services"]["nats"]["image"])


def require_docker_engine() -> None:
    """Skip unless a Docker engine answers a ping within a second."""
    import docker

    try:
        client = docker.from_env(timeout=1)
    except Exception as exc:  # no socket, bad DOCKER_HOST, ...: all mean "no engine"
        pytest.skip(f"no Docker engine answers ({type(exc).__name__}: {exc})")
    try:
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers ({type(exc).__name__}: {exc})")
    finally:
        client.close()


@pytest.fixture(scope="module")
def nats_url() -> Iterator[str]:
    require_docker_engine()
    from testcontainers.community.nats import NatsContainer

    with NatsContainer(compose_nats_image(), jetstream=True) as container:
        yield container.nats_uri()


async def test_jetstream_round_trip_through_the_event_bus(nats_url: str) -> None:
    stream, subject = f"CV_SMOKE_{uuid.uuid4().hex[:8].upper()}", "cv.smoke.completed"
    records = [f"record-{i}".encode() for i in range(3)]

    bus = EventBus(nats_url, "deploy-smoke", connect_timeout_s=5.0)
    assert await bus.connect(), f"EventBus could not reach {nats_url}"
    try:
        await bus.ensure_stream(stream, (subject,))
        acked = [await bus.publish_durable(subject, data) for data in records]
        assert acked == [True, True, True], "JetStream did not ack every record (they went to the outbox)"
    finally:
        await bus.close()

    reader = await nats.connect(nats_url, connect_timeout=5)
    try:
        js = reader.jetstream()
        info = await js.stream_info(stream)
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (3, 1, 3)
        subscription = await js.pull_subscribe(subject, durable="smoke", stream=stream)
        messages = await subscription.fetch(3, timeout=5)
        assert [m.data for m in messages] == records
        assert [m.metadata.sequence.stream for m in messages] == [1, 2, 3]
        for message in messages:
            await message.ack()
    finally:
        await reader.close()
