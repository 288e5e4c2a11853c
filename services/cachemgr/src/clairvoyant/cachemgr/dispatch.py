"""Directives out: one ``ApplyDirectivesRequest`` per worker per batch, on NATS
``cv.cache.directives.<worker_id>``, as a request the worker answers.

Contract: ``send`` never blocks its caller on a worker and never raises.  Each batch is sent once:
a worker that refuses it (``applied`` 0: it checked the batch and applied nothing), does not answer
within the timeout, or cannot be reached because NATS is down is logged and counted
(``cv_cachemgr_directive_batches_total``), and the batch is dropped.  Directives are advice: the
next completion or tick decides again from what the index then says, so retrying a stale batch
would only do harm.  A directive whose kind its worker's engine cannot apply (the worker lists it
in ``WorkerStats.unsupported_directives``: a vLLM or SGLang worker) is not sent at all, and is
counted in ``cv_cachemgr_directives_unsupported_total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import nats
from google.protobuf.message import DecodeError

from clairvoyant.cachemgr import convert, metrics
from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.core.bus import EventBus
from clairvoyant.policy.cache import CacheDirective

logger = logging.getLogger(__name__)

DIRECTIVES_PREFIX = "cv.cache.directives"


def directives_subject(worker_id: str) -> str:
    """The subject a worker takes directives on; the id as one subject token, as the worker
    writes it (separators and wildcards become '_')."""
    token = "".join("_" if c in ".*>" or c.isspace() else c for c in worker_id) or "_"
    return f"{DIRECTIVES_PREFIX}.{token}"


def by_worker(directives: Sequence[CacheDirective]) -> dict[str, list[CacheDirective]]:
    """The directives grouped per worker, each group in issue order, workers in first-seen order."""
    groups: dict[str, list[CacheDirective]] = {}
    for item in directives:
        groups.setdefault(item.worker_id, []).append(item)
    return groups


class Dispatcher:
    def __init__(self, bus: EventBus, timeout_s: float) -> None:
        self.bus = bus
        self.timeout_s = timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        # worker -> the directive kinds its engine cannot apply (from its heartbeats)
        self.unsupported: dict[str, frozenset[str]] = {}

    def send(self, directives: Sequence[CacheDirective]) -> None:
        """Count ``directives`` and send them, a batch per worker, in background tasks."""
        for item in directives:
            metrics.DIRECTIVES.labels(item.kind).inc()
        for worker_id, batch in by_worker(self._supported(directives)).items():
            task = asyncio.create_task(self._send(worker_id, batch), name=f"cachemgr-directives-{worker_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _supported(self, directives: Sequence[CacheDirective]) -> list[CacheDirective]:
        kept = []
        for item in directives:
            if item.kind in self.unsupported.get(item.worker_id, frozenset()):
                metrics.DIRECTIVES_UNSUPPORTED.labels(item.kind).inc()
            else:
                kept.append(item)
        return kept

    async def _send(self, worker_id: str, batch: list[CacheDirective]) -> None:
        client = self.bus.client
        if client is None or not self.bus.connected:
            metrics.DIRECTIVE_BATCHES.labels("unsent").inc()
            logger.warning("NATS is down: %d directive(s) for %s dropped", len(batch), worker_id)
            return
        request = worker_pb2.ApplyDirectivesRequest(directives=[convert.directive(item) for item in batch])
        try:
            reply = await client.request(
                directives_subject(worker_id), request.SerializeToString(), timeout=self.timeout_s
            )
            applied = worker_pb2.ApplyDirectivesResponse.FromString(reply.data).applied
        except (nats.errors.Error, TimeoutError, OSError) as exc:  # no responders, a timeout
            metrics.DIRECTIVE_BATCHES.labels("unanswered").inc()
            logger.warning("%d directive(s) for %s went unanswered: %r", len(batch), worker_id, exc)
            return
        except DecodeError:
            metrics.DIRECTIVE_BATCHES.labels("unanswered").inc()
            logger.warning("the answer of %s to %d directive(s) could not be read", worker_id, len(batch))
            return
        if applied == 0:
            metrics.DIRECTIVE_BATCHES.labels("refused").inc()
            logger.warning(
                "%s refused %d directive(s) (%s); not retried",
                worker_id, len(batch), ", ".join(sorted({item.kind for item in batch})),
            )  # fmt: skip
            return
        metrics.DIRECTIVE_BATCHES.labels("applied").inc()

    async def settle(self) -> None:
        """Until every batch sent so far has its answer (or gave up)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
