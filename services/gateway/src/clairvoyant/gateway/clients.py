"""gRPC clients of the services the gateway drives: scheduler, workers and (optionally) profiler.

Each turns a failed call into the shared error hierarchy, so the pipeline only sees
``ClairvoyantError``s, and passes the current trace context as call metadata.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol, TypeAlias

import grpc

from clairvoyant.contracts.v1 import (
    common_pb2,
    profiler_pb2,
    profiler_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from clairvoyant.core.errors import ClairvoyantError, QueueFull, Unavailable
from clairvoyant.core.grpc_errors import ERROR_TRAILER, from_rpc_error
from clairvoyant.core.grpcutil import channel
from clairvoyant.core.telemetry import grpc_metadata
from clairvoyant.core.wire import app_metadata_to_proto
from clairvoyant.gateway import metrics
from clairvoyant.gateway.ratelimit import FullQueues, ServiceBusy
from clairvoyant.gateway.request import GenerationRequest

logger = logging.getLogger(__name__)

GenerateCall: TypeAlias = grpc.aio.UnaryStreamCall  # the stream of worker_pb2.GenerateResponse


def has_detail(err: grpc.aio.AioRpcError) -> bool:
    """Whether a service (rather than the gRPC runtime) raised this error with an ErrorDetail."""
    return any(key == ERROR_TRAILER for key, _ in err.trailing_metadata() or ())


def rpc_error(err: grpc.aio.AioRpcError, what: str) -> ClairvoyantError:
    """The typed error behind ``err``.  Transport failures name ``what`` failed but keep gRPC's
    details (internal addresses) out of the message, which clients see; they go to the log at
    WARNING, since such a failure answers the client 503.

    A bare CANCELLED that the caller did not cause is gRPC's own load shedding: a server with more
    calls waiting to be picked up than ``grpc.server.max_pending_requests`` (1,000) cancels some at
    random (a server shutting down answers UNAVAILABLE instead).  The service is up, only busy:
    that is a 429 with a retry hint, not a 503.
    """
    if has_detail(err):
        return from_rpc_error(err)
    if err.code() == grpc.StatusCode.CANCELLED:
        logger.info("the %s shed a call (gRPC CANCELLED, too many calls pending)", what)
        metrics.BUSY_REFUSALS.labels("scheduler_shed").inc()
        return ServiceBusy(f"the {what} is overloaded; retry shortly", retry_after_s=1.0)
    logger.warning("the %s failed: %s %s", what, err.code().name, err.details())
    if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unavailable(f"the {what} timed out", code="timeout")
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        return Unavailable(f"the {what} is unavailable; retry shortly", retry_after_s=1.0)
    return from_rpc_error(err)


# Codes of a call the service may never have seen, or shed: worth another try.
_TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNKNOWN,
    }
)


class SchedulerClient:
    def __init__(
        self,
        address: str,
        schedule_timeout_s: float,
        queue_full_hold_s: float = 0.25,
        complete_timeout_s: float = 5.0,
    ) -> None:
        """``queue_full_hold_s``: how long a QueueFull answers further requests for its model
        without asking the scheduler (see ``FullQueues``); 0 asks every time."""
        self.address = address
        self.schedule_timeout_s = schedule_timeout_s
        self.complete_timeout_s = complete_timeout_s
        self.full_queues = FullQueues(queue_full_hold_s)
        self._channel = channel(address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    async def schedule(self, request: scheduler_pb2.ScheduleRequest) -> scheduler_pb2.Placement:
        """Waits in the model's global queue.  Raises QueueFull (busy: the model's queue is full, or
        the scheduler shed the call), NoWorkers, Unavailable (the scheduler is down), ..."""
        refusal = self.full_queues.refusal(request.model)
        if refusal is not None:
            raise refusal
        try:
            placement: scheduler_pb2.Placement = await self._stub.Schedule(
                request, timeout=self.schedule_timeout_s, metadata=grpc_metadata()
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise Unavailable(
                    f"no worker had room within {self.schedule_timeout_s:g} s", code="queue_timeout"
                ) from None
            error = rpc_error(err, "scheduler")
            if type(error) is QueueFull:  # the model's queue, not the scheduler's own shedding
                metrics.BUSY_REFUSALS.labels("queue_full").inc()
                self.full_queues.mark(request.model, error)
            raise error from None
        return placement

    async def complete(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> bool:
        """Releases a placement; ``output_tokens``: what the call generated (0 when unknown).
        False when the scheduler did not answer (unreachable, timed out, shed) and a retry may
        succeed; True otherwise.  Never raises: the scheduler also reaps placements of dead calls."""
        request = scheduler_pb2.CompleteRequest(
            request_id=request_id, worker_id=worker_id, status=status, output_tokens=output_tokens
        )
        try:
            await self._stub.Complete(request, timeout=self.complete_timeout_s, metadata=grpc_metadata())
        except grpc.aio.AioRpcError as err:
            logger.warning("Complete(%s) failed: %s %s", request_id, err.code().name, err.details())
            return has_detail(err) or err.code() not in _TRANSIENT
        return True

    async def renew(self, owner: str, request_ids: list[str]) -> list[str] | None:
        """Extends ``owner``'s placement leases; returns the ids the scheduler holds none on, or
        None when the call failed (logged; the leases outlast a few failed renewals)."""
        request = scheduler_pb2.RenewRequest(owner=owner, request_ids=request_ids)
        try:
            reply: scheduler_pb2.RenewResponse = await self._stub.Renew(
                request, timeout=5.0, metadata=grpc_metadata()
            )
        except grpc.aio.AioRpcError as err:
            logger.warning("Renew of %d placement leases failed: %s", len(request_ids), err.code().name)
            return None
        return list(reply.unknown_request_ids)

    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot:
        try:
            snap: scheduler_pb2.SchedulerSnapshot = await self._stub.Snapshot(
                scheduler_pb2.SnapshotRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as err:
            raise rpc_error(err, "scheduler") from None
        return snap

    async def close(self) -> None:
        await self._channel.close()


class WorkerPool:
    """One channel per worker address, opened on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, worker_pb2_grpc.WorkerStub] = {}  # one per channel, made once

    def generate(self, address: str, request: worker_pb2.GenerateRequest) -> GenerateCall:
        stub = self._stubs.get(address)
        if stub is None:
            chan = self._channels.get(address)
            if chan is None:
                chan = self._channels[address] = channel(address)
            stub = self._stubs[address] = worker_pb2_grpc.WorkerStub(chan)
        return stub.Generate(request, metadata=grpc_metadata())

    async def forget_if_broken(self, address: str) -> None:
        """Drop the channel to a worker that cannot be reached, so that the next request to that
        address (a restarted worker) starts afresh instead of waiting out gRPC's reconnect back-off.
        A channel that still works is kept: other requests may be streaming over it."""
        chan = self._channels.get(address)
        if chan is not None and chan.get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            del self._channels[address]
            self._stubs.pop(address, None)
            await chan.close(grace=None)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        self._stubs.clear()
        for chan in channels:
            with contextlib.suppress(Exception):
                await chan.close(grace=None)


class AnnotateClient(Protocol):
    async def annotate(
        self, request: GenerationRequest, prompt_tokens: int
    ) -> common_pb2.SysAnnotations | None:
        """The profiler's predictions, or None (the request continues un-annotated, and
        ``cv_gateway_unannotated_requests_total`` counts why).  Never raises."""
        ...


class NoAnnotator:
    """No profiler is configured: every request goes un-annotated."""

    async def annotate(
        self, request: GenerationRequest, prompt_tokens: int
    ) -> common_pb2.SysAnnotations | None:
        metrics.UNANNOTATED.labels("no_profiler").inc()
        return None


def skip_reason(code: grpc.StatusCode, was_connected: bool) -> str:
    """Why a failed Annotate left the request un-annotated (a ``UNANNOTATED_REASONS`` label).

    A deadline that passed while the channel was still connecting means the profiler could not
    be reached in time, not that it answered slowly.
    """
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout" if was_connected else "unavailable"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unavailable"
    return "error"


class ProfilerClient:
    """Asks the profiler within a few milliseconds; a slow or dead profiler means the reactive tier."""

    def __init__(self, address: str, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._channel = channel(address)
        self._stub = profiler_pb2_grpc.ProfilerStub(self._channel)

    def connect(self) -> None:
        """Start connecting now, so the first request's deadline is not spent on the handshake."""
        self._channel.get_state(try_to_connect=True)

    def connected(self) -> bool:
        return self._channel.get_state() == grpc.ChannelConnectivity.READY

    async def annotate(
        self, request: GenerationRequest, prompt_tokens: int
    ) -> common_pb2.SysAnnotations | None:
        if request.app_metadata is None:
            # Nothing to look up: the profiler keys everything by workflow and agent.
            metrics.UNANNOTATED.labels("no_metadata").inc()
            return None
        msg = profiler_pb2.AnnotateRequest(
            request_id=request.request_id,
            tenant=request.tenant,
            app_metadata=app_metadata_to_proto(request.app_metadata),
            model=request.model,
            prompt_tokens=prompt_tokens,
            arrival_time=request.arrival_time,
        )
        was_connected = self.connected()
        try:
            reply: profiler_pb2.AnnotateResponse = await self._stub.Annotate(
                msg, timeout=self.timeout_s, metadata=grpc_metadata()
            )
        except grpc.aio.AioRpcError as err:
            reason = skip_reason(err.code(), was_connected)
            metrics.UNANNOTATED.labels(reason).inc()
            logger.debug("Annotate(%s) skipped (%s): %s", request.request_id, reason, err.code().name)
            return None
        return reply.annotations

    async def close(self) -> None:
        await self._channel.close()
