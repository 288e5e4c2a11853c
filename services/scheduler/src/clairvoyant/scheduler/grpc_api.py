"""The gRPC Scheduler servicer and the NATS heartbeat handler: a thin adapter over the core.

Everything runs on one event loop, so the core needs no locks.  A Schedule call submits to the
core and awaits a Future that ``_dispatch`` resolves once the core places the request; dispatch
runs after every event that can free or add capacity (submit, complete, heartbeat, resume), and
at the time the core asks to be woken (``GlobalScheduler.wake_at``: a policy waiting on something
of its own, e.g. a model group's configuration search).

A placement whose decision names a ``kv_source`` (SAGA's stolen sessions) is answered only after
``KvMover`` has moved the session's KV there, or given up (kv_migration.py says why here).
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2
from clairvoyant.core.clock import Clock
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest, NoWorkers, QueueFull, Unavailable
from clairvoyant.core.grpc_errors import abort
from clairvoyant.core.model_groups import ModelGroups
from clairvoyant.core.telemetry import extract_context
from clairvoyant.core.telemetry import tracer as get_tracer
from clairvoyant.core.wire import kv_batch
from clairvoyant.scheduler import convert, metrics
from clairvoyant.scheduler.core import Decision, GlobalScheduler, Reclaimed
from clairvoyant.scheduler.kv_migration import KvMove, KvMover
from clairvoyant.scheduler.liveness import WorkerProber

logger = logging.getLogger(__name__)

_STATUS_BY_ERROR: dict[type[ClairvoyantError], str] = {
    QueueFull: "queue_full",
    NoWorkers: "no_workers",
    InvalidRequest: "invalid",
}


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        core: GlobalScheduler,
        clock: Clock,
        tracer: trace.Tracer | None = None,
        *,
        kv_mover: KvMover | None = None,
        prober: WorkerProber | None = None,
        groups: ModelGroups | None = None,
    ) -> None:
        """``kv_mover``: moves KV for placements that name a ``kv_source``; None: they recompute.
        ``prober``: asks a silent worker for its stats before it is expired; None: silence expires.
        ``groups``: the model groups the core's routing policy was built with (the Snapshot lists them)."""
        self.core = core
        self.clock = clock
        self._tracer = tracer or get_tracer(__name__)
        self.kv_mover = kv_mover
        self.prober = prober
        self.groups = groups or ModelGroups()
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._sessions: dict[str, tuple[str, str]] = {}  # waiting request -> (tenant, workflow_id)
        self._moving: dict[str, asyncio.Task[None]] = {}  # placed request -> its KV move
        self._gauge_models: set[str] = set()  # models whose gauges we have set, to zero them later
        self._gauge_values: dict[str, tuple[int, int]] = {}  # model -> (queue depth, workers) last set
        self._wake: asyncio.TimerHandle | None = None  # the next dispatch the core asked for
        self._wake_at: float | None = None  # its time on the clock; None iff no timer is set
        self._closing = False

    # ---- RPCs -----------------------------------------------------------------------------------

    async def Schedule(
        self, request: scheduler_pb2.ScheduleRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.Placement:
        parent = extract_context(context.invocation_metadata())
        attributes = {
            "cv.request_id": request.request_id,
            "cv.model": request.model,
            "cv.tenant": request.tenant,
        }
        error: ClairvoyantError | None = None
        with self._tracer.start_as_current_span(
            "scheduler.queue_wait", context=parent, attributes=attributes
        ) as span:
            try:
                decision = await self._place(request)
            except ClairvoyantError as err:
                error = err
                span.set_status(Status(StatusCode.ERROR, err.message))
                span.set_attribute("cv.error_code", err.code)
            else:
                span.set_attribute("cv.worker_id", decision.worker_id)
                span.set_attribute("cv.served_model", decision.worker.model)
                span.set_attribute("cv.queue_wait_s", decision.queue_wait_s)
                span.set_attribute("cv.base_priority", decision.base_priority)
        if error is not None:
            await abort(context, error)  # outside the span: the abort exception is not a failure of ours
        lease_s = self.core.leases.lease_s if self.core.leases is not None else 0.0
        return convert.placement(decision, self.core.policy_name, lease_s)

    async def Complete(
        self, request: scheduler_pb2.CompleteRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.CompleteResponse:
        # A served call teaches the process table its service (here: dispatch to completion, the
        # RPC carries no engine time) and its model's traffic counters its output tokens; a
        # cancelled or failed one only leaves it.
        served = request.status in (common_pb2.REQUEST_STATUS_OK, common_pb2.REQUEST_STATUS_UNSPECIFIED)
        now = self.clock.now() if served else None
        released = self.core.complete(
            request.request_id, request.worker_id or None, now=now, output_tokens=request.output_tokens
        )
        if released:
            self._dispatch()
        return scheduler_pb2.CompleteResponse(released=released)

    async def Renew(
        self, request: scheduler_pb2.RenewRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.RenewResponse:
        unknown = self.core.renew(request.owner, list(request.request_ids), self.clock.now())
        return scheduler_pb2.RenewResponse(unknown_request_ids=unknown)

    async def Snapshot(
        self, request: scheduler_pb2.SnapshotRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SchedulerSnapshot:
        snapshot = convert.snapshot(self.core.snapshot(self.clock.now()), self.groups)
        snapshot.expected_models.extend(sorted(self.core.expected_models()))  # a replica is coming
        return snapshot

    async def Drain(
        self, request: scheduler_pb2.DrainRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.DrainResponse:
        found = self.core.drain(request.worker_id, request.drain)
        if found:
            logger.info("worker %s %s", request.worker_id, "draining" if request.drain else "resumed")
            self._dispatch()
        return scheduler_pb2.DrainResponse(found=found)

    async def Active(
        self, request: scheduler_pb2.ActiveRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ActiveSnapshot:
        now = self.clock.now()
        held = self.core.held_calls(now)
        return convert.active_snapshot(held, self.core.agent_models(), self.core.traffic(), now)

    async def ExpectModels(
        self, request: scheduler_pb2.ExpectModelsRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ExpectModelsResponse:
        before = self.core.expected_models()
        rejected = self.core.expect_models(request.models)
        if self.core.expected_models() != before:
            logger.info("expected models: %s", ", ".join(sorted(self.core.expected_models())) or "none")
        for queued in rejected:
            self._fail_waiter(queued.request_id, queued.model)
        self._publish_gauges()
        return scheduler_pb2.ExpectModelsResponse()

    # ---- events ---------------------------------------------------------------------------------

    async def on_worker_stats(self, msg: Msg) -> None:
        """NATS handler for ``cv.workers.*.stats``; a malformed heartbeat is logged and dropped."""
        try:
            stats = worker_pb2.WorkerStats.FromString(msg.data)
        except DecodeError:
            logger.warning("undecodable worker stats on %s", msg.subject)
            return
        if not stats.worker_id or not stats.model:
            logger.warning("worker stats without worker_id or model on %s", msg.subject)
            return
        self.heard_from(stats)
        self._dispatch()

    async def on_kv_events(self, msg: Msg) -> None:
        """NATS handler for ``cv.kv.events.*``: a worker's KV events, into the core's index.  A
        malformed batch is counted and dropped (a dropped batch then shows as a sequence gap)."""
        try:
            batch = kv_batch(worker_pb2.KvEventBatch.FromString(msg.data))
        except DecodeError:
            logger.warning("undecodable KV events on %s", msg.subject)
            metrics.KV_EVENTS_DROPPED.labels("undecodable").inc()
            return
        except InvalidRequest as err:
            logger.warning("invalid KV events on %s: %s", msg.subject, err.message)
            metrics.KV_EVENTS_DROPPED.labels("invalid").inc()
            return
        applied = self.core.apply_kv_events(batch, self.clock.now())
        if applied.gap:
            logger.info(
                "KV events of %s skipped a sequence number: its index waits for a CLEARED", batch.worker_id
            )
            metrics.KV_EVENT_GAPS.inc()

    def heard_from(self, stats: worker_pb2.WorkerStats) -> None:
        """A worker's report (a heartbeat, or its answer to a probe): update it, and release the
        placements on it that it has not heard of for a while."""
        if stats.worker_id not in {w.worker_id for w in self.core.workers()}:
            logger.info("worker %s joined (model %s, %s)", stats.worker_id, stats.model, stats.grpc_address)
        report = convert.worker_report(stats)
        now = self.clock.now()
        self.core.update_worker(report, now)
        if report.held_requests is not None:
            self._log_reclaimed(
                self.core.reconcile(report.worker_id, report.held_requests, now), report.model
            )

    async def expire(self) -> None:
        """Release placements whose lease ran out; ask silent workers whether they are alive, and
        drop the ones that do not answer, failing the waiters their loss leaves without any worker."""
        self._log_reclaimed(self.core.reclaim(self.clock.now()))
        silent = self.core.silent_workers(self.clock.now())
        if silent and self.prober is not None:
            answers = await self.prober.stats_of([w.address for w in silent])
            for worker, stats in zip(silent, answers, strict=True):
                if stats is not None and stats.worker_id == worker.worker_id:
                    logger.debug("worker %s missed its heartbeats but answered Stats", worker.worker_id)
                    metrics.WORKER_PROBES.labels("answered").inc()
                    self.heard_from(stats)
                else:
                    metrics.WORKER_PROBES.labels("silent").inc()
        for gone in self.core.expire_workers(self.clock.now()):
            logger.warning(
                "worker %s expired: %d placements failed, %d queued requests rejected",
                gone.worker_id,
                len(gone.failed_request_ids),
                len(gone.rejected_request_ids),
            )
            metrics.PLACEMENTS_FAILED.labels(gone.model).inc(len(gone.failed_request_ids))
            for request_id in gone.rejected_request_ids:
                self._fail_waiter(request_id, gone.model)
        self._dispatch()  # reclaimed placements and answering workers may have made room

    def _fail_waiter(self, request_id: str, model: str) -> None:
        """The core rejected a queued request: no worker of ``model`` is left, nor expected."""
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(NoWorkers(f"the last worker serving model {model!r} went away"))

    def _log_reclaimed(self, reclaimed: list[Reclaimed], model: str | None = None) -> None:
        if not reclaimed:  # the usual case, on every heartbeat and expiry pass
            return
        models = {w.worker_id: w.model for w in self.core.workers()}
        for gone in reclaimed:
            logger.warning(
                "placement of %s on %s reclaimed (%s; owner %r): nobody released it",
                gone.request_id,
                gone.worker_id,
                gone.reason,
                gone.owner,
            )
            label = model or models.get(gone.worker_id, metrics.UNKNOWN_MODEL)
            metrics.PLACEMENTS_RECLAIMED.labels(label, gone.reason).inc()

    def close(self) -> None:
        """Refuse new requests and fail the waiting ones, so shutdown does not wait on them."""
        self._closing = True
        if self._wake is not None:
            self._wake.cancel()
            self._wake = self._wake_at = None
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(Unavailable("the scheduler is shutting down"))
        self._waiters.clear()

    # ---- internals ------------------------------------------------------------------------------

    async def _place(self, request: scheduler_pb2.ScheduleRequest) -> Decision:
        now = self.clock.now()
        try:
            if self._closing:
                raise Unavailable("the scheduler is shutting down")
            self.core.submit(convert.queued_request(request, now), now)
        except ClairvoyantError as err:
            known = request.model in {w.model for w in self.core.workers()} or request.model in self.groups
            label = request.model if known else metrics.UNKNOWN_MODEL
            metrics.REQUESTS.labels(label, _STATUS_BY_ERROR.get(type(err), "failed")).inc()
            raise
        waiter: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = waiter
        if request.app_metadata.workflow_id:
            self._sessions[request.request_id] = (request.tenant, request.app_metadata.workflow_id)
        self._dispatch()
        try:
            decision = await waiter
        except asyncio.CancelledError:
            self._abandon(request.request_id, request.model, waiter)
            raise
        except ClairvoyantError:
            metrics.REQUESTS.labels(request.model, "failed").inc()
            raise
        finally:
            self._sessions.pop(request.request_id, None)
        if request.model in self.groups:
            metrics.GROUP_PLACEMENTS.labels(request.model, decision.worker.model).inc()
        return decision

    def _abandon(self, request_id: str, model: str, waiter: asyncio.Future[Decision]) -> None:
        """The caller went away (cancelled or deadline): give back whatever it held."""
        if self._waiters.get(request_id) is waiter:
            del self._waiters[request_id]
        metrics.REQUESTS.labels(model, "cancelled").inc()
        move = self._moving.pop(request_id, None)
        if self.core.cancel(request_id):
            logger.info("request %s cancelled while queued", request_id)
        elif move is not None:  # placed, its KV on the way: nobody will use the placement
            move.cancel()
            self.core.complete(request_id)
            self._dispatch()
        elif waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            # Placed in the same loop turn the caller left: nobody will use the placement.
            self.core.complete(request_id, waiter.result().worker_id)
            self._dispatch()
        self._publish_gauges()

    def _dispatch(self) -> None:
        orphans = True
        while orphans:  # releasing an orphaned placement frees room for the next request
            orphans = False
            for decision in self.core.dispatch(self.clock.now()):
                waiter = self._waiters.pop(decision.request_id, None)
                if waiter is None or waiter.done():
                    self.core.complete(decision.request_id, decision.worker_id)
                    orphans = True
                    continue
                move = self._kv_move(decision)
                if move is None:
                    waiter.set_result(decision)
                else:
                    task = asyncio.create_task(self._move_then_answer(move, decision, waiter))
                    self._moving[decision.request_id] = task
                model = decision.worker.model
                metrics.REQUESTS.labels(model, "placed").inc()
                metrics.QUEUE_WAIT.labels(model).observe(decision.queue_wait_s)
        self._publish_gauges()
        if not self._closing:
            self._arm_wake()

    def _arm_wake(self) -> None:
        """Dispatch again when the core asks to (``wake_at``), unless a dispatch is already due by
        then: one timer, moved earlier when the core's wish moves earlier."""
        now = self.clock.now()
        wake_at = self.core.wake_at(now)
        if wake_at is None or (self._wake_at is not None and self._wake_at <= wake_at):
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = wake_at
        self._wake = asyncio.get_running_loop().call_later(max(0.0, wake_at - now), self._woken)

    def _woken(self) -> None:
        self._wake = self._wake_at = None
        self._dispatch()

    def _kv_move(self, decision: Decision) -> KvMove | None:
        """The move ``decision`` asks for, when there is a mover, the source is still known and
        the call has a session; None otherwise (the call recomputes its prefix)."""
        if decision.kv_source is None or self.kv_mover is None:
            return None
        source = next((w for w in self.core.workers() if w.worker_id == decision.kv_source), None)
        session = self._sessions.get(decision.request_id)
        if source is None or session is None or not source.address or not decision.worker.address:
            return None
        tenant, workflow_id = session
        return KvMove(
            decision.request_id,
            source.address,
            decision.worker.address,
            decision.worker.model,
            tenant,
            workflow_id,
        )

    async def _move_then_answer(
        self, move: KvMove, decision: Decision, waiter: asyncio.Future[Decision]
    ) -> None:
        assert self.kv_mover is not None
        try:
            await self.kv_mover.move(move)  # bounded by its timeout; never raises
        finally:
            self._moving.pop(decision.request_id, None)
            if not waiter.done():
                waiter.set_result(decision)

    def _publish_gauges(self) -> None:
        # Runs on every dispatch, so on every Schedule's path: only changed values are set.
        workers: dict[str, int] = {}
        for worker in self.core.workers():
            workers[worker.model] = workers.get(worker.model, 0) + 1
        depths = self.core.queue_depths()
        for model in self._gauge_models | depths.keys() | workers.keys():
            values = (depths.get(model, 0), workers.get(model, 0))
            if self._gauge_values.get(model) != values:
                self._gauge_values[model] = values
                metrics.QUEUE_DEPTH.labels(model).set(values[0])
                metrics.WORKERS.labels(model).set(values[1])
        self._gauge_models |= depths.keys() | workers.keys()
