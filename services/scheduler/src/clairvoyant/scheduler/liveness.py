"""Asks a worker for its stats over gRPC: the scheduler's check before it expires a silent worker.

Heartbeats ride NATS; when they stop, the worker may be fine and only the bus down.  A worker that
answers ``Stats`` counts as alive (its answer is a heartbeat), so serving goes on through a NATS
outage and only a worker that is really gone is expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from clairvoyant.contracts.v1 import worker_pb2, worker_pb2_grpc
from clairvoyant.core.grpcutil import channel

logger = logging.getLogger(__name__)


class WorkerProber:
    """One channel per worker address, opened on first use."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def stats(self, address: str) -> worker_pb2.WorkerStats | None:
        """The worker's own report, or None when it does not answer within the timeout."""
        if not address:
            return None
        chan = self._channels.get(address)
        if chan is None:
            chan = self._channels[address] = channel(address)
        try:
            reply: worker_pb2.WorkerStats = await worker_pb2_grpc.WorkerStub(chan).Stats(
                worker_pb2.WorkerStatsRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as err:
            logger.debug("Stats probe of %s failed: %s", address, err.code().name)
            await self._forget(address)
            return None
        return reply

    async def stats_of(self, addresses: list[str]) -> list[worker_pb2.WorkerStats | None]:
        """``stats`` for each address, concurrently."""
        return list(await asyncio.gather(*(self.stats(address) for address in addresses)))

    async def _forget(self, address: str) -> None:
        """Drop a failed channel: a restarted worker on the same address gets a fresh connection
        instead of gRPC's reconnect back-off."""
        chan = self._channels.pop(address, None)
        if chan is not None:
            with contextlib.suppress(Exception):
                await chan.close(grace=None)

    async def close(self) -> None:
        for address in list(self._channels):
            await self._forget(address)
