"""Durable ingestion through real NATS JetStream: nothing lost, nothing counted twice, across a
crash between the database write and the ack and a restart; a dead NATS only pauses learning."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import grpc
import nats
import pytest
from nats.js.client import JetStreamContext
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT
from clairvoyant.core.clock import ManualClock
from clairvoyant.profiler.app import ProfilerApp
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.persistence import LogEntry, ProfileRepository, ProfileSnapshot
from clairvoyant.stack.natsserver import NatsServer, free_port
from tests.profiler.test_service_records import EPOCH, completion_records, reference_store, small_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

BATCH = 16


def settings(nats_url: str, database_url: str, **overrides: object) -> ProfilerSettings:
    values: dict[str, object] = {
        "nats_url": nats_url,
        "database_url": database_url,
        "profiler_port": 0,
        "metrics_port": 0,
        "nats_connect_timeout_s": 1.0,
        "batch_size": BATCH,
        "fetch_timeout_s": 0.2,
        "retry_interval_s": 0.2,
        "tick_interval_s": 0.05,
        "ack_wait_s": 30.0,
        "min_instances": 10,
        "high_instances": 40,
        "require_convergence": False,
        "resynthesize_every": 10,
        **overrides,
    }
    return ProfilerSettings(**values)  # type: ignore[arg-type]


class CrashingRepository(ProfileRepository):
    """Logs ``healthy_appends`` batches, then fails every write (log and snapshots): the process
    'dies' after applying records in memory but before they are logged or acked."""

    def __init__(self, database_url: str, healthy_appends: int) -> None:
        super().__init__(database_url)
        self.healthy_appends = healthy_appends
        self.failed = threading.Event()

    def append(self, entries: Sequence[LogEntry]) -> None:
        if self.healthy_appends == 0:
            self.failed.set()
            raise OSError("the database went away")
        self.healthy_appends -= 1
        super().append(entries)

    def save(self, snapshots: Iterable[ProfileSnapshot]) -> int:
        if self.failed.is_set():
            raise OSError("the database went away")
        return super().save(snapshots)


def records_total(outcome: str) -> float:
    return REGISTRY.get_sample_value("cv_profiler_records_total", {"outcome": outcome}) or 0.0


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition`` (plain or async) until it holds; the timeout only stops a hung test."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value if isinstance(value, bool) else await value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def publish(js: JetStreamContext, payloads: Iterable[bytes]) -> None:
    for data in payloads:
        await js.publish(COMPLETIONS_SUBJECT, data)


async def test_nothing_lost_and_nothing_counted_twice_across_a_crash_and_restart(
    nats_url: str, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'profiler.db'}"
    records = completion_records("acme", "coding", 30, seed=5)
    first, rest = records[:200], records[200:]
    assert len(rest) > 100
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=COMPLETIONS_STREAM, subjects=[COMPLETIONS_SUBJECT])
    await publish(js, (m.SerializeToString() for m in first))
    clock = ManualClock(EPOCH)  # the records' own time scale: no instance is idle until the test says so

    # Run 1: five batches are stored and acked, then every write fails; stop in that state.
    crashing = CrashingRepository(database_url, healthy_appends=5)
    service = ProfilerApp(settings(nats_url, database_url), clock=clock, repository=crashing)
    await service.start()
    await until(crashing.failed.is_set, "the write to fail")
    in_memory = len(service.store.profile("acme", "coding").to_state()["seen"])
    await service.stop()
    info = await js.consumer_info(COMPLETIONS_STREAM, "profiler")
    assert info.ack_floor.stream_seq == 5 * BATCH  # exactly the stored batches were acked
    stored = ProfileRepository(database_url).load("acme", "coding")
    assert stored is not None and len(stored.to_state()["seen"]) == 5 * BATCH < in_memory

    # Run 2, on the same database: the unacked records come back, the rest and duplicates arrive.
    skipped, undecodable, duplicates = records_total("no_workflow"), records_total("undecodable"), records_total(
        "duplicate"
    )
    service = ProfilerApp(settings(nats_url, database_url), clock=clock)
    await service.start()
    assert len(service.store.profile("acme", "coding").to_state()["seen"]) == 5 * BATCH
    anonymous = common_pb2.CompletionRecord(request_id="no-meta", tenant="acme")
    replayed = first[70:90] + rest[:10]  # around the crash point, and records of this run
    await publish(js, [anonymous.SerializeToString(), b"\xff not a protobuf"])
    await publish(js, (m.SerializeToString() for m in rest + replayed))

    async def drained() -> bool:
        info = await js.consumer_info(COMPLETIONS_STREAM, "profiler")
        return info.num_pending == 0 and info.num_ack_pending == 0

    await until(drained, "every record to be acked")
    profile = service.store.profile("acme", "coding")
    reference = reference_store(records, small_config()).profile("acme", "coding")
    assert profile.instances == reference.instances == 30
    assert sum(a.calls for a in profile.agents.values()) == len(records)
    assert sorted(profile.to_state()["seen"]) == sorted(m.request_id for m in records)
    assert profile.to_state() == reference.to_state()
    assert records_total("duplicate") - duplicates == len(replayed)
    assert (records_total("no_workflow") - skipped, records_total("undecodable") - undecodable) == (1, 1)

    # An instance left open is closed by the idle tick once the clock passes the timeout.
    partial = completion_records("acme", "coding", 1, seed=6, first=30)[:5]
    await publish(js, (m.SerializeToString() for m in partial))
    await until(drained, "the partial instance to be acked")
    assert profile.instances == 30 and len(profile.to_state()["open"]) == 1
    clock.advance(31 * 1000.0 + profile.config.idle_timeout_s)
    await until(lambda: profile.instances == 31, "the idle instance to close")
    await service.stop()

    # What run 2 ended with is exactly what a third start reads back.
    restored = ProfileRepository(database_url).load("acme", "coding")
    assert restored is not None and restored.to_state() == profile.to_state()
    assert restored.instances == 31 and restored.to_state()["open"] == {}
    await nc.close()


class SnapshotlessRepository(ProfileRepository):
    """Logs every batch, fails every snapshot: the process 'dies' between the log and a snapshot."""

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url)
        self.failed_snapshots = 0

    def save(self, snapshots: Iterable[ProfileSnapshot]) -> int:
        self.failed_snapshots += 1
        raise OSError("the database went away")


async def test_a_restart_after_a_crash_before_the_snapshot_replays_the_log_to_the_same_state(
    nats_url: str, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'profiler.db'}"
    records = completion_records("acme", "coding", 12, seed=13)
    more = completion_records("acme", "coding", 6, seed=14, first=12)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=COMPLETIONS_STREAM, subjects=[COMPLETIONS_SUBJECT])
    await publish(js, (m.SerializeToString() for m in records))
    clock = ManualClock(EPOCH)

    async def drained() -> bool:
        try:
            info = await js.consumer_info(COMPLETIONS_STREAM, "profiler")
        except nats.js.errors.NotFoundError:
            return False  # not bound yet
        return info.num_pending == 0 and info.num_ack_pending == 0

    # Run 1: every record is logged and acked; every snapshot (due every 40 changes) fails.
    failing = SnapshotlessRepository(database_url)
    service = ProfilerApp(settings(nats_url, database_url, snapshot_every_records=40), clock=clock,
                              repository=failing)  # fmt: skip
    await service.start()
    await until(drained, "every record to be acked")
    never_restarted = service.store.profile("acme", "coding")
    await service.stop()  # its last snapshot fails too
    assert failing.failed_snapshots >= len(records) // 40
    stored = ProfileRepository(database_url)
    assert stored.list() == [] and len(stored.log_seqs()) == len(records)
    stored.close()

    # Run 2 restores from the log alone: exactly what run 1 had, and what the core alone learns.
    service = ProfilerApp(settings(nats_url, database_url, snapshot_every_records=40), clock=clock)
    await service.start()
    restored = service.store.profile("acme", "coding")
    assert restored.to_state() == never_restarted.to_state()
    assert restored.to_state() == reference_store(records, small_config()).profile("acme", "coding").to_state()
    await publish(js, (m.SerializeToString() for m in more + records[:20]))  # new records, and duplicates
    await until(drained, "the new records to be acked")
    await service.stop()  # a graceful stop snapshots every changed profile and prunes the log
    assert restored.to_state() == reference_store(records + more, small_config()).profile(
        "acme", "coding"
    ).to_state()
    stored = ProfileRepository(database_url)
    assert [p.instances for p in stored.list()] == [18] and stored.log_seqs() == []
    reloaded = stored.load("acme", "coding")
    stored.close()
    assert reloaded is not None and reloaded.to_state() == restored.to_state()
    await nc.close()


async def test_without_nats_annotate_serves_from_memory_and_learning_resumes_when_it_comes_up(
    tmp_path: Path,
) -> None:
    database_url = f"sqlite:///{tmp_path / 'profiler.db'}"
    trained = reference_store(completion_records("acme", "coding", 40, seed=7), small_config())
    repository = ProfileRepository(database_url)
    repository.save([ProfileSnapshot.of(trained.profile("acme", "coding"))])
    repository.close()
    port = free_port()
    nats_url = f"nats://127.0.0.1:{port}"
    service = ProfilerApp(settings(nats_url, database_url), clock=ManualClock(EPOCH))
    await asyncio.wait_for(service.start(), timeout=30)  # returns although NATS is down
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            stub = profiler_pb2_grpc.ProfilerStub(channel)
            reply = await stub.Annotate(
                profiler_pb2.AnnotateRequest(
                    request_id="r",
                    tenant="acme",
                    app_metadata=common_pb2.AppMetadata(workflow_type_id="coding", workflow_id="x", agent_id="planner"),
                ),
                timeout=5,
            )
        assert not service.bus.connected
        assert [a.agent_id for a in reply.annotations.next_agents][:1] == ["explorer"]
        assert reply.annotations.confidence in (common_pb2.CONFIDENCE_LOW, common_pb2.CONFIDENCE_HIGH)

        server = NatsServer(tmp_path / "nats", port=port).start()
        try:
            nc = await nats.connect(nats_url)
            js = nc.jetstream()
            await until(lambda: service.bus.connected, "the bus to reconnect")
            # The bus creates the stream on connect; publish once it exists.
            await until(_stream_exists(js), "the stream to exist")
            more = completion_records("acme", "coding", 2, seed=8, first=40)
            await publish(js, (m.SerializeToString() for m in more))
            profile = service.store.profile("acme", "coding")
            await until(lambda: profile.instances == 42, "the new instances to be learned")
            await nc.close()
            # NATS restarts (same port, same JetStream store): the consumer carries on where it was.
            server.stop()
            await until(lambda: not service.bus.connected, "the bus to notice")
            server = NatsServer(tmp_path / "nats", port=port).start()
            nc = await nats.connect(nats_url)
            js = nc.jetstream()
            await until(_stream_exists(js), "the stream to be back")
            later = completion_records("acme", "coding", 2, seed=9, first=42)
            await publish(js, (m.SerializeToString() for m in later))
            await until(lambda: profile.instances == 44, "learning to resume after the restart")
            assert sum(a.calls for a in profile.agents.values()) == sum(
                a.calls for a in trained.profile("acme", "coding").agents.values()
            ) + len(more) + len(later)
            await nc.close()
        finally:
            await service.stop()
            server.stop()
    finally:
        await service.stop()


def _stream_exists(js: JetStreamContext) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await js.stream_info(COMPLETIONS_STREAM)
        except nats.js.errors.NotFoundError:
            return False
        return True

    return check
