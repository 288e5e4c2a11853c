"""The event bus degrades when NATS is down and loses no durable record once it comes back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from clairvoyant.core.bus import (
    COMPLETIONS_STREAM,
    COMPLETIONS_SUBJECT,
    WORKER_STATS_WILDCARD,
    EventBus,
    worker_stats_subject,
)
from clairvoyant.stack.natsserver import NatsServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_connect_to_a_dead_server_returns_promptly() -> None:
    bus = EventBus(f"nats://127.0.0.1:{free_port()}", "test", connect_timeout_s=1.0)
    started = time.monotonic()
    assert await bus.connect() is False
    assert time.monotonic() - started < 3.0
    await bus.publish("cv.workers.w.stats", b"dropped")  # fire-and-forget: dropped, no error
    assert await bus.publish_durable(COMPLETIONS_SUBJECT, b"kept") is False
    await bus.close()


async def test_outbox_is_flushed_in_order_when_nats_comes_back(tmp_path: Path) -> None:
    port = free_port()
    bus = EventBus(f"nats://127.0.0.1:{port}", "test", connect_timeout_s=1.0,
                   streams={COMPLETIONS_STREAM: (COMPLETIONS_SUBJECT,)})
    assert await bus.connect() is False
    for i in range(5):
        assert await bus.publish_durable(COMPLETIONS_SUBJECT, f"record-{i}".encode()) is False
    server = NatsServer(tmp_path / "nats", port=port).start()
    try:
        # The bus creates the stream itself on reconnect, then flushes the outbox into it.
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                await js.stream_info(COMPLETIONS_STREAM)
                break
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.2)
        deadline = time.monotonic() + 15
        while (await js.stream_info(COMPLETIONS_STREAM)).state.messages < 5 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        sub = await js.subscribe(COMPLETIONS_SUBJECT, ordered_consumer=True)
        got = [(await sub.next_msg(timeout=5)).data.decode() for _ in range(5)]
        assert got == [f"record-{i}" for i in range(5)]
        assert bus.connected
        assert await bus.publish_durable(COMPLETIONS_SUBJECT, b"direct") is True
        await nc.close()
    finally:
        await bus.close()
        server.stop()


@pytest.mark.parametrize("worker_id", ["w1", "node1.example.com-50061", "qwen2.5-7b-0", "a*b>c d"])
async def test_every_worker_id_reaches_the_stats_wildcard(tmp_path: Path, worker_id: str) -> None:
    """The scheduler subscribes to one token per worker: ids with dots (hostnames, model names)
    or NATS wildcards must still land there, as one token."""
    server = NatsServer(tmp_path / "js", port=free_port()).start()
    try:
        nc = await nats.connect(server.url)
        received: asyncio.Queue[str] = asyncio.Queue()

        async def on_stats(msg: Msg) -> None:
            await received.put(msg.data.decode())

        await nc.subscribe(WORKER_STATS_WILDCARD, cb=on_stats)
        await nc.publish(worker_stats_subject(worker_id), worker_id.encode())
        assert await asyncio.wait_for(received.get(), 5.0) == worker_id
        await nc.close()
    finally:
        server.stop()
