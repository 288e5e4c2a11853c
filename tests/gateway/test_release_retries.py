"""A placement release (Scheduler.Complete) is never lost: one that fails is retried in the
background, and one that never gets through is reclaimed by the scheduler's lease, which the
gateway stops renewing before its first attempt.  Also: the model catalogue refreshes ahead of
its TTL, off the request's path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.core.grpc_errors import abort
from clairvoyant.gateway.clients import SchedulerClient, WorkerPool
from clairvoyant.gateway.leases import HeldPlacements
from clairvoyant.gateway.models import ModelCatalog
from clairvoyant.gateway.pipeline import Pipeline
from clairvoyant.gateway.releases import Release, ReleaseRetries
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from tests.gateway.fakes import start_server
from tests.scheduler.test_service_integration import eventually
from tests.scheduler.test_service_leases import Beats, placed, reclaimed, schedule, stats

OK = common_pb2.REQUEST_STATUS_OK


def release_failures(outcome: str) -> float:
    return REGISTRY.get_sample_value("cv_gateway_release_failures_total", {"outcome": outcome}) or 0.0


class FlakyScheduler(SchedulerClient):
    """The real client, whose first ``failures`` Completes fail as if the scheduler were unreachable."""

    def __init__(self, address: str, failures: int) -> None:
        super().__init__(address, schedule_timeout_s=5.0)
        self.failures = failures
        self.attempts: list[str] = []

    async def complete(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> bool:
        self.attempts.append(request_id)
        if self.failures > 0:
            self.failures -= 1
            return False
        return await super().complete(request_id, worker_id, status, output_tokens)


class NoRecords:
    async def publish_durable(self, subject: str, data: bytes) -> bool:
        return True


def pipeline_over(client: SchedulerClient, held: HeldPlacements) -> Pipeline:
    return Pipeline(
        client,
        WorkerPool(),
        ModelCatalog(client),
        NoRecords(),
        held=held,
        release_retries=ReleaseRetries(client, first_backoff_s=0.05),
    )


@pytest.fixture
async def scheduler_app(nats_server: str, request: pytest.FixtureRequest) -> AsyncIterator[SchedulerApp]:
    """The real scheduler in-process; ``indirect`` parameters are its settings."""
    settings = getattr(request, "param", {})
    app = SchedulerApp(
        SchedulerSettings(
            host="127.0.0.1",
            scheduler_port=0,
            nats_url=nats_server,
            metrics_port=0,
            expiry_interval_s=0.1,
            **settings,
        )  # fmt: skip
    )
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def has_worker(stub: scheduler_pb2_grpc.SchedulerStub) -> bool:
    snap = await stub.Snapshot(scheduler_pb2.SnapshotRequest())
    return len(snap.workers) == 1


@pytest.mark.integration
async def test_a_release_the_scheduler_missed_is_retried_until_it_answers(
    nats_server: str, scheduler_app: SchedulerApp
) -> None:
    before = release_failures("retried")
    client = FlakyScheduler(scheduler_app.address, failures=2)
    held = HeldPlacements(owner="gw-flaky")
    pipeline = pipeline_over(client, held)
    stub = scheduler_pb2_grpc.SchedulerStub(client._channel)
    try:
        async with Beats(nats_server) as beats:
            beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=None)
            await eventually(lambda: has_worker(stub))
            placement = await client.schedule(schedule("r1", owner=held.owner))
            held.hold("r1", placement.lease_s)
            assert await placed(stub) == {"w0": 1}
            await pipeline.release("r1", placement.worker_id, OK, output_tokens=3)
            assert "r1" not in held  # no longer renewed, whatever happens next
            assert len(pipeline.release_retries) == 1  # the first attempt failed: retried in the background
            await eventually(lambda: _placed_is(stub, {"w0": 0}), timeout_s=5.0)
            assert client.attempts == [
                "r1",
                "r1",
                "r1",
            ]  # failed, failed, released (30 s lease: not reclaimed)
            assert len(pipeline.release_retries) == 0
    finally:
        await pipeline.aclose()
        await client.close()
    assert release_failures("retried") - before == 2


@pytest.mark.integration
@pytest.mark.parametrize("scheduler_app", [{"placement_lease_s": 0.6}], indirect=True)
async def test_a_release_that_never_gets_through_is_reclaimed_by_the_lease(
    nats_server: str, scheduler_app: SchedulerApp
) -> None:
    """The gateway keeps renewing what it still holds (``kept``); the placement whose release
    never reaches the scheduler (``lost``) is reclaimed once its 0.6 s lease runs out."""
    reclaimed_before, abandoned_before = reclaimed("lease_expired"), release_failures("abandoned")
    client = FlakyScheduler(scheduler_app.address, failures=1_000)
    held = HeldPlacements(owner="gw-cut-off")
    pipeline = pipeline_over(client, held)
    pipeline.release_retries.max_attempts = 3
    stub = scheduler_pb2_grpc.SchedulerStub(client._channel)
    renewing = asyncio.ensure_future(held.renew_forever(client, tick_s=0.05))
    try:
        async with Beats(nats_server) as beats:
            beats.workers["w0"] = stats("w0", "127.0.0.1:1", held=None)  # reports nothing it holds
            await eventually(lambda: has_worker(stub))
            for request_id in ("kept", "lost"):
                placement = await client.schedule(schedule(request_id, owner=held.owner))
                held.hold(request_id, placement.lease_s)
            assert placement.lease_s == pytest.approx(0.6)
            await pipeline.release("lost", placement.worker_id, OK)
            await asyncio.sleep(1.5)  # 2.5 leases
            assert await placed(stub) == {"w0": 1}  # only "kept", renewed all along
            assert client.attempts == ["lost"] * 3
            assert len(pipeline.release_retries) == 0
    finally:
        renewing.cancel()
        await pipeline.aclose()
        await client.close()
    assert reclaimed("lease_expired") - reclaimed_before == 1
    assert release_failures("abandoned") - abandoned_before == 1


async def _placed_is(stub: scheduler_pb2_grpc.SchedulerStub, expected: dict[str, int]) -> bool:
    return await placed(stub) == expected


# ---- the parts on their own ---------------------------------------------------------------------


class Completes:
    """A completer that fails its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[Release] = []

    async def complete(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> bool:
        self.calls.append(Release(request_id, worker_id, status, output_tokens))
        self.failures -= 1
        return self.failures < 0


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


async def test_retries_back_off_and_stop_at_max_attempts() -> None:
    completer, sleeps = Completes(failures=100), Sleeps()
    retries = ReleaseRetries(completer, max_attempts=5, first_backoff_s=0.1, sleep=sleeps)
    task = retries.retry(Release("r", "w", OK, 7))
    assert task is not None and len(retries) == 1
    assert await task is False
    assert sleeps.waits == pytest.approx([0.1, 0.2, 0.4, 0.8])  # 4 more attempts after the first
    assert completer.calls == [Release("r", "w", OK, 7)] * 4
    assert len(retries) == 0


async def test_a_retry_that_gets_through_stops_retrying() -> None:
    completer, sleeps = Completes(failures=1), Sleeps()
    retries = ReleaseRetries(completer, max_attempts=5, first_backoff_s=0.1, sleep=sleeps)
    task = retries.retry(Release("r", "w", OK, 0))
    assert task is not None and await task is True
    assert len(completer.calls) == 2 and sleeps.waits == pytest.approx([0.1, 0.2])


async def test_beyond_max_pending_a_release_is_left_to_the_lease_at_once() -> None:
    gate = asyncio.Event()

    async def slow_sleep(seconds: float) -> None:
        await gate.wait()

    abandoned = release_failures("abandoned")
    retries = ReleaseRetries(Completes(failures=0), max_pending=1, sleep=slow_sleep)
    first = retries.retry(Release("a", "w", OK, 0))
    assert retries.retry(Release("b", "w", OK, 0)) is None
    assert release_failures("abandoned") - abandoned == 1
    gate.set()
    assert first is not None and await first is True


@pytest.mark.parametrize(
    ("kwargs", "named"), [({"max_attempts": 0}, "0"), ({"first_backoff_s": -1.0}, "-1.0")]
)
def test_bad_retry_settings_are_refused_by_name(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=f"{next(iter(kwargs))} .*{named}"):
        ReleaseRetries(Completes(failures=0), **kwargs)  # type: ignore[arg-type]


class RefusingScheduler(scheduler_pb2_grpc.SchedulerServicer):
    async def Complete(self, request, context):  # noqa: N802
        await abort(context, InvalidRequest("no such placement"))


async def test_complete_says_whether_a_retry_may_help() -> None:
    unreachable = SchedulerClient("127.0.0.1:1", schedule_timeout_s=1.0, complete_timeout_s=1.0)
    try:
        assert await unreachable.complete("r", "w", OK) is False  # UNAVAILABLE: try again
    finally:
        await unreachable.close()
    server, address = await start_server(RefusingScheduler())
    refusing = SchedulerClient(address, schedule_timeout_s=1.0)
    try:
        assert await refusing.complete("r", "w", OK) is True  # answered: retrying cannot help
    finally:
        await refusing.close()
        await server.stop(None)


class SlowSnapshots:
    """Answers Snapshot once ``gate`` opens; ``models`` are the served models it reports."""

    def __init__(self) -> None:
        self.models = ["m1"]
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot:
        self.calls += 1
        await self.gate.wait()
        workers = [scheduler_pb2.WorkerState(worker_id=f"w-{m}", model=m) for m in self.models]
        return scheduler_pb2.SchedulerSnapshot(workers=workers)


async def test_the_model_catalogue_refreshes_ahead_without_making_a_request_wait() -> None:
    source, clock = SlowSnapshots(), [0.0]
    catalog = ModelCatalog(source, ttl_s=1.0, now=lambda: clock[0])
    assert set(await catalog.models()) == {"m1"} and source.calls == 1
    clock[0] = 0.4
    await catalog.resolve("m1")
    assert source.calls == 1  # young: nothing asked
    source.gate.clear()  # from now on the scheduler is slow to answer
    source.models = ["m1", "m2"]
    clock[0] = 0.6  # half the TTL passed: answered from the cache, refreshed in the background
    assert (await asyncio.wait_for(catalog.resolve("m1"), timeout=1.0)).name == "m1"
    await asyncio.sleep(0)
    assert source.calls == 2
    assert (await asyncio.wait_for(catalog.resolve("m1"), timeout=1.0)).name == "m1"
    assert source.calls == 2  # one refresh at a time
    source.gate.set()
    await asyncio.sleep(0.01)
    assert (await catalog.resolve("m2")).name == "m2"  # the background refresh landed
    clock[0] = 5.0  # idle past the TTL: this call waits for a Snapshot of its own
    source.models = ["m3"]
    assert (await catalog.resolve("m3")).name == "m3" and source.calls == 3


async def test_a_failed_refresh_ahead_keeps_the_cache_until_the_ttl() -> None:
    class Failing(SlowSnapshots):
        async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot:
            if self.calls:
                self.calls += 1
                raise Unavailable("the scheduler is unavailable; retry shortly")
            return await super().snapshot(timeout_s)

    source, clock = Failing(), [0.0]
    catalog = ModelCatalog(source, ttl_s=1.0, now=lambda: clock[0])
    await catalog.models()
    clock[0] = 0.7
    assert (await catalog.resolve("m1")).name == "m1"
    await asyncio.sleep(0.01)  # the refresh ahead failed, quietly
    assert source.calls == 2
    assert (await catalog.resolve("m1")).name == "m1"  # still within the TTL: the cache answers
    clock[0] = 1.1
    with pytest.raises(Unavailable):
        await catalog.resolve("m1")  # past the TTL the failure reaches the caller, as before
