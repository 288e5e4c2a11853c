"""Moves a session's KV between two workers for a placement that names a ``kv_source`` (SAGA §5.2
step 3): the source's ExportKV stream piped into the destination's ImportKV.

    Schedule(call) ─> core.dispatch ─> Decision(worker=thief, kv_source=victim)
                                         │ KvMover.move: victim.ExportKV(session) ──chunks──> thief.ImportKV
                                         v  (bounded by timeout_s; any failure: recompute)
                                       the Schedule reply (the gateway then calls Generate on the thief)

Why here and not in the gateway: the scheduler service already holds everything a move needs (the
decision, both workers' addresses, the call's session and the caller waiting for its placement),
so the move needs no new field in the Placement contract, and delaying that one reply delays
exactly that one call.  The one new dependency is the scheduler calling the workers' two KV RPCs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import NamedTuple

import grpc
from prometheus_client import Counter, Histogram

from clairvoyant.contracts.v1 import worker_pb2, worker_pb2_grpc
from clairvoyant.core.grpcutil import channel
from clairvoyant.core.metrics import LATENCY_BUCKETS

logger = logging.getLogger(__name__)

# outcome: moved | nothing (the source caches none of the session) | failed | timeout
MIGRATIONS = Counter(
    "cv_scheduler_kv_migrations_total", "KV moves for stolen sessions by outcome", ["outcome"]
)
MIGRATED_TOKENS = Counter("cv_scheduler_kv_migrated_tokens_total", "Prefix tokens the destinations now cache")
MIGRATION_SECONDS = Histogram(
    "cv_scheduler_kv_migration_seconds",
    "ExportKV + ImportKV of one move, whatever its outcome",
    buckets=LATENCY_BUCKETS,
)


class KvMove(NamedTuple):
    request_id: str  # the placement the move is for; names the transfer
    source: str  # host:port of the worker holding the KV
    target: str  # host:port of the worker the call is placed on
    model: str
    tenant: str
    workflow_id: str  # the session


class KvMover:
    """One gRPC channel per worker address, opened on first use.  ``move`` never raises: a move
    that fails or takes longer than ``timeout_s`` is given up (the call recomputes its prefix)."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def move(self, move: KvMove) -> int:
        """Prefix tokens the target caches after the move; 0 when nothing was moved."""
        start = time.monotonic()
        outcome, tokens = "failed", 0
        try:
            async with asyncio.timeout(self.timeout_s):
                tokens = await self._pipe(move)
            outcome = "moved" if tokens else "nothing"
        except TimeoutError:
            outcome = "timeout"
            logger.warning("KV move for %s gave up after %.2f s", move.request_id, self.timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                outcome = "nothing"
            else:
                logger.warning(
                    "KV move for %s failed: %s %s", move.request_id, err.code().name, err.details()
                )
        except Exception:  # e.g. the export stream broke while the import was reading it
            logger.warning("KV move for %s failed", move.request_id, exc_info=True)
        finally:
            MIGRATIONS.labels(outcome).inc()
            MIGRATION_SECONDS.observe(time.monotonic() - start)
        MIGRATED_TOKENS.inc(tokens)
        logger.info(
            "KV move for %s (%s -> %s): %s, %d tokens",
            move.request_id,
            move.source,
            move.target,
            outcome,
            tokens,
        )
        return tokens

    async def _pipe(self, move: KvMove) -> int:
        request = worker_pb2.ExportKVRequest(
            request_id=move.request_id, tenant=move.tenant, workflow_id=move.workflow_id, model=move.model
        )
        export = self._stub(move.source).ExportKV(request)
        try:
            first = await export.read()  # NOT_FOUND (nothing cached) surfaces here, before any import
            if first is grpc.aio.EOF:
                return 0

            async def chunks() -> AsyncIterator[worker_pb2.KVChunk]:
                chunk = first  # read() throughout: grpc.aio forbids mixing it with ``async for``
                while chunk is not grpc.aio.EOF:
                    yield chunk
                    chunk = await export.read()

            reply: worker_pb2.ImportKVResponse = await self._stub(move.target).ImportKV(chunks())
            return reply.tokens
        finally:
            export.cancel()  # a no-op once the stream ended; stops the export on a failure

    def _stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        chan = self._channels.get(address)
        if chan is None:
            chan = self._channels[address] = channel(address)
        return worker_pb2_grpc.WorkerStub(chan)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for chan in channels:
            with contextlib.suppress(Exception):
                await chan.close(grace=None)
