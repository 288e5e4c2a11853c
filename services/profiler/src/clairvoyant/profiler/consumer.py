"""Learning from ``cv.requests.completed``: a durable JetStream pull consumer over the ProfileStore.

One step of the loop:

    fetch a batch ──> apply each record to the store (the core drops request ids it has seen)
                  ──> tick(now) when caught up (closes idle instances)
                  ──> write every profile changed since the last good write, in ONE transaction
                  ──> ack the batch                      (write failed: nak it, retry later)

A record is acked only once the state that contains it is in the database, so a crash loses
nothing: unacked records come back and the ones already stored come back as duplicates, which the
persisted ``seen`` ids reject.  Idle instances are closed only when a fetch comes back short (no
backlog), so a restart that replays a backlog does not close instances whose records are still
queued.  A dead NATS only pauses learning: Annotate keeps answering from memory.
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
from clairvoyant.profiler.core import IngestStatus, ProfileStore
from clairvoyant.profiler.persistence import ProfileRepository, ProfileSnapshot

logger = logging.getLogger(__name__)

Key = tuple[str, str]  # (tenant, workflow_type_id)

NO_WORKFLOW = "no_workflow"
UNDECODABLE = "undecodable"
_UNCHANGED = {IngestStatus.DUPLICATE, IngestStatus.STALE}  # the core changed nothing for these


class WallClock:
    """Seconds since the epoch: the time scale of the gateway's timing fields, which ``tick`` compares."""

    def now(self) -> float:
        return time.time()


class Learner:
    """Applies records to the store and remembers which profiles changed since the last write.

    Not thread-safe: one task calls ``apply``/``tick``/``snapshots`` and waits for the write of the
    snapshots before it applies more (Annotate only reads)."""

    def __init__(self, store: ProfileStore) -> None:
        self.store = store
        self.dirty: set[Key] = set()

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
                result = self.store.ingest(keyed.tenant, keyed.workflow_type_id, keyed.record)
                if result.status not in _UNCHANGED or result.reset:
                    self.dirty.add((keyed.tenant, keyed.workflow_type_id))
                if result.closed:
                    m.INSTANCES_CLOSED.labels("end").inc(len(result.closed))
                outcome = result.status.value
        m.RECORDS.labels(outcome).inc()
        return outcome

    def tick(self, now: float) -> int:
        """Close idle instances; returns how many closed."""
        closed = 0
        for key, profile in self.store.profiles.items():
            traces = profile.tick(now)
            if traces:
                closed += len(traces)
                self.dirty.add(key)
        if closed:
            m.INSTANCES_CLOSED.labels("idle").inc(closed)
        return closed

    def snapshots(self) -> list[ProfileSnapshot]:
        return [ProfileSnapshot.of(self.store.profiles[key]) for key in sorted(self.dirty)]


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

    async def run(self) -> None:
        """Until ``stop``: a step at a time; a failed step is logged and retried after a pause."""
        while not self._stopping.is_set():
            try:
                await self.step()
            except Exception:
                logger.exception("profiler consumer step failed")
                await self._pause()

    def stop(self) -> None:
        """Finish the current step (its batch is acked or nakked), then return from ``run``."""
        self._stopping.set()

    async def step(self) -> int:
        """Fetch, apply, tick, write, ack.  Returns the number of records fetched."""
        subscription = await self._subscribe()
        if subscription is None:
            await self._pause()
            return 0
        try:
            msgs = await subscription.fetch(self.settings.batch_size, timeout=self.settings.fetch_timeout_s)
        except TimeoutError:  # nats' own and asyncio's (a pull request that timed out)
            msgs = []  # nothing new within fetch_timeout_s
        except (nats.errors.Error, OSError) as exc:
            logger.warning("fetching completion records failed (%r); binding the consumer again", exc)
            self._unbind()
            await self._pause()
            return 0
        for msg in msgs:
            self.learner.apply(msg.data)
        now = self.clock.now()
        caught_up = len(msgs) < self.settings.batch_size and self.bus.connected
        if caught_up and now - self._last_tick >= self.settings.tick_interval_s:
            self._last_tick = now
            self.learner.tick(now)
        m.PROFILES.set(len(self.learner.store.profiles))
        if await self.persist():
            await _settle(msgs, ack=True)
        else:
            await _settle(msgs, ack=False, delay=self.settings.retry_interval_s)
            await self._pause()
        return len(msgs)

    async def persist(self) -> bool:
        """Write every profile changed since the last good write; False when the write failed."""
        if not self.learner.dirty:
            return True
        snapshots = self.learner.snapshots()  # on the loop: the store is only changed on the loop
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self.repository.save, snapshots)
        except Exception:
            m.PERSIST_FAILURES.inc()
            logger.exception("writing %d profile(s) failed; their records stay unacked", len(snapshots))
            return False
        m.PERSIST_SECONDS.observe(time.perf_counter() - started)
        self.learner.dirty.clear()
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
