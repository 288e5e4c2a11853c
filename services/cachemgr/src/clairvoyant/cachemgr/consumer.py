"""Completion records in: a durable JetStream pull consumer of ``cv.requests.completed``.

One step:

    fetch a batch ──> each record: decode -> core.on_completion -> directives, sent per worker
                  ──> ack the batch

A record is acked once the core has it (the core is in memory, and directives are advice: a
record seen twice would only repeat advice, so nothing waits on the workers' answers).  A record
that cannot be decoded is counted and acked: it will never decode.  The durable consumer keeps its
place on the server, so a restarted cache manager resumes after the last acked record; a new one
starts with the records published from then on (older ones would direct caches that moved on).
NATS down, at start or later: the step pauses, with a backoff doubling up to 30 s, and binds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext

from clairvoyant.cachemgr import convert, metrics
from clairvoyant.cachemgr.config import CacheManagerSettings
from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.cachemgr.core.manager import call_problem
from clairvoyant.cachemgr.dispatch import Dispatcher
from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT, EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.policy.cache import CacheDirective

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


class CompletionConsumer:
    def __init__(
        self,
        bus: EventBus,
        core: CacheManagerCore,
        dispatcher: Dispatcher,
        settings: CacheManagerSettings,
        clock: Clock,
    ) -> None:
        self.bus = bus
        self.core = core
        self.dispatcher = dispatcher
        self.settings = settings
        self.clock = clock
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._stopping = asyncio.Event()
        self._backoff_s = settings.cachemgr_retry_interval_s

    async def run(self) -> None:
        """Until ``stop``: a step at a time; a failed step is logged and retried after a pause."""
        while not self._stopping.is_set():
            try:
                await self.step()
            except Exception:
                logger.exception("cache manager consumer step failed")
                await self._pause()

    @property
    def bound(self) -> bool:
        """Whether the durable consumer is bound (records flow)."""
        return self._subscription is not None

    def stop(self) -> None:
        """Finish the current step (its batch is acked), then return from ``run``."""
        self._stopping.set()

    async def step(self) -> int:
        """Fetch, apply and ack one batch; returns the number of records fetched."""
        if not self.bus.connected:  # the bus reconnects on its own, every second
            metrics.CONSUMER_CONNECTED.set(0)
            await self._pause(backoff=False)
            return 0
        subscription = await self._subscribe()
        if subscription is None:
            await self._pause()
            return 0
        try:
            msgs = await subscription.fetch(
                self.settings.cachemgr_batch_size, timeout=self.settings.cachemgr_fetch_timeout_s
            )
        except TimeoutError:  # nats' own and asyncio's: nothing new within the fetch timeout
            return 0
        except (nats.errors.Error, OSError) as exc:
            logger.warning("fetching completion records failed (%r); binding the consumer again", exc)
            self._unbind()
            await self._pause()
            return 0
        self._backoff_s = self.settings.cachemgr_retry_interval_s
        for msg in msgs:
            self.dispatcher.send(self.apply(msg.data))
        await _ack(msgs)
        metrics.observe(self.core.stats())
        return len(msgs)

    def apply(self, data: bytes) -> list[CacheDirective]:
        """One serialized CompletionRecord into the core; the directives its policy answers."""
        try:
            call = convert.completed_call(common_pb2.CompletionRecord.FromString(data))
        except DecodeError as exc:
            problem = str(exc) or "undecodable"
        else:
            problem = call_problem(call)
        if problem:
            metrics.MALFORMED.labels("completions").inc()
            self.core.note_malformed("completions")
            logger.warning("dropped a malformed completion record: %s", problem)
            return []
        metrics.COMPLETIONS.inc()
        try:
            return self.core.on_completion(call, self.clock.now())
        except Exception:  # a policy bug: acked all the same, or the record would come back forever
            logger.exception("the cache policy failed on %s; no directives for it", call.request_id)
            return []

    async def _subscribe(self) -> JetStreamContext.PullSubscription | None:
        if self._subscription is not None:
            metrics.CONSUMER_CONNECTED.set(1)
            return self._subscription
        client = self.bus.client
        if client is None:
            return None
        name = self.settings.cachemgr_consumer_name
        config = ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.NEW,  # a new durable only: an existing one resumes
            ack_wait=self.settings.cachemgr_ack_wait_s,
            max_ack_pending=max(1000, 4 * self.settings.cachemgr_batch_size),
            filter_subject=COMPLETIONS_SUBJECT,
        )
        try:
            await self.bus.ensure_stream(COMPLETIONS_STREAM, (COMPLETIONS_SUBJECT,))
            self._subscription = await client.jetstream().pull_subscribe(
                COMPLETIONS_SUBJECT, durable=name, stream=COMPLETIONS_STREAM, config=config
            )
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            logger.warning("could not bind the durable consumer %s: %s", name, exc)
            return None
        metrics.CONSUMER_CONNECTED.set(1)
        logger.info("consuming %s as durable %s", COMPLETIONS_SUBJECT, name)
        return self._subscription

    def _unbind(self) -> None:
        self._subscription = None
        metrics.CONSUMER_CONNECTED.set(0)

    async def _pause(self, *, backoff: bool = True) -> None:
        """Sleep (less when stopping): the current backoff, then doubled up to 30 s; without
        ``backoff``, the first retry interval."""
        pause = self._backoff_s if backoff else self.settings.cachemgr_retry_interval_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=pause)
        if backoff:
            self._backoff_s = min(self._backoff_s * 2, MAX_BACKOFF_S)

    async def close(self) -> None:
        if self._subscription is not None:
            # The connection is going away anyway; the durable consumer stays on the server.
            with contextlib.suppress(nats.errors.Error, OSError):
                await self._subscription.unsubscribe()
        self._unbind()


async def _ack(msgs: list[Msg]) -> None:
    for msg in msgs:
        try:
            await msg.ack()
        except (nats.errors.Error, OSError) as exc:
            # Unacked records come back after ack_wait: their advice is given twice, harmlessly.
            logger.warning("acking a completion record failed: %s", exc)
            return
