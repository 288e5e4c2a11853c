"""Learning from ``cv.requests.completed``: a durable JetStream pull consumer over the ProfileStore.

One step of the loop:

    fetch a batch ──> apply each record to the store (the core drops request ids it has seen)
                  ──> tick(now) when caught up (closes idle instances)
                  ──> append every change (record or tick) to the log, in ONE transaction
                  ──> ack the batch                      (append failed: nak it, retry later)
                  ──> snapshot the profiles that are due (CV_SNAPSHOT_*), pruning the log

A record is acked only once the log holds it, so a crash loses nothing: unacked records come back,
and the ones already logged come back as duplicates, which the restored ``seen`` ids reject (the
log insert skips them too).  Ticks are logged with their time, so replaying the log on start
repeats the original run exactly.  Idle instances are closed only when a fetch comes back short
(no backlog), so a restart that replays a backlog does not close instances whose records are
still queued.  A dead NATS only pauses learning: Annotate keeps answering from memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import nats
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.profiler import convert
from clairvoyant.profiler import metrics as m
from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.core import CallRecord, IngestStatus, ProfileStore
from clairvoyant.profiler.persistence import Key, LogEntry, ProfileRepository, ProfileSnapshot, Restored

logger = logging.getLogger(__name__)

NO_WORKFLOW = "no_workflow"
UNDECODABLE = "undecodable"
_UNCHANGED = {IngestStatus.DUPLICATE, IngestStatus.STALE}  # the core changed nothing for these


class WallClock:
    """Seconds since the epoch: the time scale of the gateway's timing fields, which ``tick`` compares."""

    def now(self) -> float:
        return time.time()


class Learner:
    """Applies records to the store and numbers every change for the log; knows which profiles
    have changes their snapshot lacks.

    Not thread-safe: one task calls everything, and does not apply more while a write of what it
    took is in flight (Annotate only reads)."""

    def __init__(self, store: ProfileStore, next_seq: int = 1) -> None:
        self.store = store
        self.next_seq = next_seq
        self.pending: list[LogEntry] = []  # applied in memory, not in the log yet
        self.last_seq: dict[Key, int] = {}  # per profile: its last change
        self.unsnapshotted: dict[Key, int] = {}  # per profile: changes its snapshot lacks
        self.snapshot_at: dict[Key, float] = {}  # per profile: its last snapshot (or restore)
        self._taken: dict[Key, int] = {}  # per profile: unsnapshotted when its snapshot in flight was taken

    def adopt(self, restored: Restored, now: float) -> None:
        """Take over what ``ProfileRepository.restore`` rebuilt, before anything is applied."""
        for item in restored.profiles:
            key = (item.profile.tenant, item.profile.workflow_type_id)
            self.store.profiles[key] = item.profile
            self.last_seq[key] = item.last_seq
            if item.replayed:
                self.unsnapshotted[key] = item.replayed
            self.snapshot_at[key] = now
        self.next_seq = max(self.next_seq, restored.next_seq)
        m.UNSNAPSHOTTED.set(sum(self.unsnapshotted.values()))

    def apply(self, data: bytes) -> str:
        """Ingest one serialized CompletionRecord; returns its outcome (a metrics label)."""
        try:
            msg = common_pb2.CompletionRecord.FromString(data)
        except DecodeError:
            outcome = UNDECODABLE
        else:
            keyed = convert.call_record(msg)
            if keyed is None:
                outcome = NO_WORKFLOW
            else:
                key = (keyed.tenant, keyed.workflow_type_id)
                result = self.store.ingest(keyed.tenant, keyed.workflow_type_id, keyed.record)
                if result.status not in _UNCHANGED or result.reset:
                    self._log(key, keyed.record)
                if result.closed:
                    m.INSTANCES_CLOSED.labels("end").inc(len(result.closed))
                outcome = result.status.value
        m.RECORDS.labels(outcome).inc()
        return outcome

    def tick(self, now: float) -> int:
        """Close idle instances; returns how many closed.  Logged for the profiles it changed."""
        closed = 0
        for key, profile in self.store.profiles.items():
            traces = profile.tick(now)
            if traces:
                closed += len(traces)
                self._log(key, None, now)
        if closed:
            m.INSTANCES_CLOSED.labels("idle").inc(closed)
        return closed

    def _log(self, key: Key, record: CallRecord | None, tick_at: float = 0.0) -> None:
        seq = self.next_seq
        self.next_seq += 1
        self.pending.append(LogEntry(seq, key[0], key[1], record, tick_at))
        self.last_seq[key] = seq
        self.unsnapshotted[key] = self.unsnapshotted.get(key, 0) + 1

    def logged(self, count: int) -> None:
        """The first ``count`` pending entries are in the log now."""
        del self.pending[:count]

    def due(self, now: float, every_records: int, interval_s: float) -> list[Key]:
        """Profiles to snapshot: ``every_records`` changes behind, or any change ``interval_s`` old."""
        keys = []
        for key, count in self.unsnapshotted.items():
            since = self.snapshot_at.setdefault(key, now)  # a new profile: timed from its first change
            if count >= every_records or (count > 0 and now - since >= interval_s):
                keys.append(key)
        return sorted(keys)

    def changed(self) -> list[Key]:
        """Every profile with changes its snapshot lacks (what a graceful stop snapshots)."""
        return sorted(k for k, count in self.unsnapshotted.items() if count > 0)

    def snapshots(self, keys: Sequence[Key]) -> list[ProfileSnapshot]:
        """Snapshots of ``keys``, each covering the profile's last change: write them only after
        every pending entry is logged, or a snapshot could cover entries the log lost."""
        for key in keys:
            self._taken[key] = self.unsnapshotted.get(key, 0)
        return [ProfileSnapshot.of(self.store.profiles[k], self.last_seq[k]) for k in keys]

    def snapshotted(self, snapshots: Sequence[ProfileSnapshot], now: float) -> None:
        """``snapshots`` are written; changes applied since they were taken still count."""
        for snap in snapshots:
            key = (snap.tenant, snap.workflow_type_id)
            self.unsnapshotted[key] -= self._taken.pop(key)
            self.snapshot_at[key] = now
        m.UNSNAPSHOTTED.set(sum(self.unsnapshotted.values()))


class CompletionConsumer:
    """The loop that feeds a Learner from JetStream and writes through a ProfileRepository."""

    def __init__(
        self,
        bus: EventBus,
        learner: Learner,
        repository: ProfileRepository,
        settings: ProfilerSettings,
        clock: Clock | None = None,
    ) -> None:
        self.bus = bus
        self.learner = learner
        self.repository = repository
        self.settings = settings
        self.clock = clock or WallClock()
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._stopping = asyncio.Event()
        self._last_tick = float("-inf")
        self._writing: asyncio.Task[bool] | None = None  # the previous batch's write, at most one
        self._prefetch: asyncio.Task[list[Msg]] | None = None  # the next batch, fetched meanwhile

    async def run(self) -> None:
        """Until ``stop``: a step at a time; a failed step is logged and retried after a pause.
        Returns once the last write has settled its batch."""
        while not self._stopping.is_set():
            try:
                await self.step()
            except Exception:
                logger.exception("profiler consumer step failed")
                await self._pause()
        await self._written()
        await self._return_prefetched()

    def stop(self) -> None:
        """Finish the current step (its batch is acked or nakked), then return from ``run``."""
        self._stopping.set()

    async def step(self) -> int:
        """Fetch, apply and tick; then wait for the previous batch's write and start this one's,
        which acks it.  Returns the number of records fetched.

            loop:   apply k | wait write k-1, fetch k+1 | apply k+1 | wait write k, fetch k+2 | ...
            thread:           write k-1 ───────────────┘           write k ─────────────┘
        """
        subscription = await self._subscribe()
        if subscription is None:
            await self._pause()
            return 0
        fetching, self._prefetch = self._prefetch, None
        try:
            msgs = await (fetching or self._fetch(subscription))
        except TimeoutError:  # nats' own and asyncio's (a pull request that timed out)
            msgs = []  # nothing new within fetch_timeout_s
        except (nats.errors.Error, OSError) as exc:
            logger.warning("fetching completion records failed (%r); binding the consumer again", exc)
            self._unbind()
            await self._pause()
            return 0
        if len(msgs) == self.settings.batch_size and not self._stopping.is_set():
            # A backlog: the next batch arrives while this one is applied and written.
            self._prefetch = asyncio.create_task(self._fetch(subscription), name="profiler-fetch")
        for msg in msgs:
            self.learner.apply(msg.data)
        now = self.clock.now()
        caught_up = len(msgs) < self.settings.batch_size and self.bus.connected
        if caught_up and now - self._last_tick >= self.settings.tick_interval_s:
            self._last_tick = now
            self.learner.tick(now)
        m.PROFILES.set(len(self.learner.store.profiles))
        if not await self._written():
            await self._pause()
        self._start_write(msgs, now)
        return len(msgs)

    async def _fetch(self, subscription: JetStreamContext.PullSubscription) -> list[Msg]:
        return await subscription.fetch(self.settings.batch_size, timeout=self.settings.fetch_timeout_s)

    async def _return_prefetched(self) -> None:
        """Nak what a prefetch brought after ``stop``: redelivered soon, not after ack_wait, and
        with the delay of the naks before it, so after them: the records' order is kept."""
        fetching, self._prefetch = self._prefetch, None
        if fetching is None:
            return
        try:
            msgs = await fetching
        except (TimeoutError, nats.errors.Error, OSError):
            return
        await _settle(msgs, ack=False, delay=self.settings.retry_interval_s)

    async def persist(self, *, final: bool = False) -> bool:
        """Log every pending change and snapshot the profiles that are due (``final``: every
        profile with changes, as on a graceful stop), now.  False when the log append failed."""
        await self._written()
        self._start_write([], self.clock.now(), final=final)
        return await self._written()

    def _start_write(self, msgs: Sequence[Msg], now: float, *, final: bool = False) -> None:
        """Take what to write on the loop (the store is only changed on the loop) and write it in
        a task: the pending entries, then ack ``msgs``, then the snapshots that are due."""
        assert self._writing is None, "one write at a time: the log stays in sequence order"
        entries = list(self.learner.pending)
        keys = self.learner.changed() if final else self.learner.due(
            now, self.settings.snapshot_every_records, self.settings.snapshot_interval_s
        )
        if msgs or entries or keys:
            snapshots = self.learner.snapshots(keys)
            self._writing = asyncio.create_task(self._write(msgs, entries, snapshots, now), name="profiler-write")

    async def _written(self) -> bool:
        """Wait for the write in flight, if any; False when its log append failed."""
        if self._writing is None:
            return True
        try:
            return await asyncio.shield(self._writing)
        finally:
            if self._writing.done():
                self._writing = None

    async def _write(
        self, msgs: Sequence[Msg], entries: list[LogEntry], snapshots: list[ProfileSnapshot], now: float
    ) -> bool:
        if entries:
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self.repository.append, entries)
            except Exception:
                m.PERSIST_FAILURES.inc()
                logger.exception("logging %d change(s) failed; their records stay unacked", len(entries))
                await _settle(msgs, ack=False, delay=self.settings.retry_interval_s)
                return False
            m.PERSIST_SECONDS.observe(time.perf_counter() - started)
            self.learner.logged(len(entries))
        await _settle(msgs, ack=True)
        if snapshots:
            started = time.perf_counter()
            try:
                await asyncio.to_thread(self.repository.save, snapshots)
            except Exception:
                m.SNAPSHOT_FAILURES.inc()
                logger.exception("snapshotting %d profile(s) failed; the log keeps their changes", len(snapshots))
            else:
                m.SNAPSHOT_SECONDS.observe(time.perf_counter() - started)
                self.learner.snapshotted(snapshots, now)
        m.UNSNAPSHOTTED.set(sum(self.learner.unsnapshotted.values()))
        return True

    async def _subscribe(self) -> JetStreamContext.PullSubscription | None:
        if self._subscription is not None:
            return self._subscription
        client = self.bus.client
        if client is None or not self.bus.connected:
            return None
        config = ConsumerConfig(
            durable_name=self.settings.consumer_name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.settings.ack_wait_s,
            max_ack_pending=max(1000, 4 * self.settings.batch_size),
            filter_subject=COMPLETIONS_SUBJECT,
        )
        try:
            await self.bus.ensure_stream(COMPLETIONS_STREAM, (COMPLETIONS_SUBJECT,))
            self._subscription = await client.jetstream().pull_subscribe(
                COMPLETIONS_SUBJECT, durable=self.settings.consumer_name, stream=COMPLETIONS_STREAM, config=config
            )
        except (nats.errors.Error, OSError) as exc:
            logger.warning("could not bind the durable consumer %s: %s", self.settings.consumer_name, exc)
            return None
        m.CONSUMER_CONNECTED.set(1)
        logger.info("consuming %s as durable %s", COMPLETIONS_SUBJECT, self.settings.consumer_name)
        return self._subscription

    def _unbind(self) -> None:
        self._subscription = None
        if self._prefetch is not None:
            self._prefetch.cancel()  # its pull request is void; what it held is redelivered
            self._prefetch = None
        m.CONSUMER_CONNECTED.set(0)

    async def _pause(self) -> None:
        """Sleep retry_interval_s, or less when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=self.settings.retry_interval_s)

    async def close(self) -> None:
        if self._subscription is not None:
            # The connection is going away anyway; the durable consumer stays on the server.
            with contextlib.suppress(nats.errors.Error, OSError):
                await self._subscription.unsubscribe()
        self._unbind()


async def _settle(msgs: Sequence[Msg], *, ack: bool, delay: float | None = None) -> None:
    """Ack (the state holding them is stored) or nak (redeliver after ``delay``) every message."""
    for msg in msgs:
        try:
            if ack:
                await msg.ack()
            else:
                await msg.nak(delay=delay)
        except (nats.errors.Error, OSError) as exc:
            # Unsettled messages are redelivered after ack_wait; as duplicates, they change nothing.
            logger.warning("settling a completion record failed: %s", exc)
            return
