"""The scaling loop: read the scheduler, tick the policy, act through the actuator.

Each tick reads the scheduler (Snapshot + Active), updates the replica book (a starting replica
whose worker reports is ready; one past its start-up allowance is torn down and counted), asks
the policy for a decision, turns it into actions (``plan_actions``: drains first, then releases of
idle draining replicas, then starts within the GPU budget) and carries them out:

* drain: ``Scheduler.Drain`` first (routing exclusion), then the book marks it draining, and the
  worker's own ``Drain`` hands back the calls still waiting in its engine queue (best effort, in
  the background), which the gateway re-places on other replicas;
* release: the actuator stops it once it is drained and idle (no keep-alive);
* start: the actuator launches it; the book counts it as starting (its GPUs are held) until its
  worker registers.

Starts and stops run as background tasks retried with backoff, so a slow platform never stalls a
tick.  A start that finally fails is stopped again, so nothing is left half-registered.  When the
scheduler cannot be read, the tick does nothing: a dead dependency leaves the cluster as it is.
Every action is published on ``cv.scaling.<kind>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc

from clairvoyant.autoscaler import convert, metrics
from clairvoyant.autoscaler.actuators.base import Actuator, ActuatorError
from clairvoyant.autoscaler.background import Background
from clairvoyant.autoscaler.core import (
    ClusterView,
    ProfileDefaults,
    ReplicaBook,
    managed_models,
    model_profiles,
    scaling_input,
)
from clairvoyant.autoscaler.core.replicas import is_pending, pending_id
from clairvoyant.contracts.v1 import (
    autoscaler_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from clairvoyant.core.bus import EventBus
from clairvoyant.core.clock import Clock
from clairvoyant.core.grpcutil import channel
from clairvoyant.policy.scaling import (
    ModelProfile,
    ScalingDecision,
    ScalingInput,
    ScalingPolicy,
    plan_actions,
)

logger = logging.getLogger(__name__)


@dataclass
class TickResult:
    """What the last tick saw and did (the Status RPC reads it)."""

    state: ScalingInput | None = None
    decision: ScalingDecision | None = None
    at: float | None = None  # wall-clock seconds
    error: str = ""


@dataclass
class ScalerOptions:
    gpu_budget: int
    interval_s: float
    configured_models: list[str] = field(default_factory=list)
    profile_overrides: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    defaults: ProfileDefaults = ProfileDefaults()
    startup_allowance_s: float = 300.0
    retries: int = 5
    backoff_s: float = 1.0
    rpc_timeout_s: float = 2.0


class Scaler:
    def __init__(
        self,
        policy: ScalingPolicy,
        actuator: Actuator,
        scheduler: scheduler_pb2_grpc.SchedulerStub,
        bus: EventBus | None,
        clock: Clock,
        options: ScalerOptions,
    ) -> None:
        self.policy = policy
        self.actuator = actuator
        self.scheduler = scheduler
        self.bus = bus
        self.clock = clock
        self.options = options
        self.book = ReplicaBook(options.startup_allowance_s)
        self.last = TickResult()
        self.failed_starts_total = 0
        self._background = Background(options.retries, options.backoff_s)
        self._busy: set[str] = set()  # replica ids with a stop in flight
        self._expected: list[str] | None = None
        self._launches = 0
        self._clamped: dict[str, int] = {}
        self._worker_addresses: dict[str, str] = {}  # worker id -> gRPC address, as last read
        self._worker_channels: dict[str, grpc.aio.Channel] = {}  # by address, opened on a drain

    # ---- one tick -------------------------------------------------------------------------------

    async def read(self) -> ClusterView:
        """The scheduler's view (raises grpc.aio.AioRpcError when it cannot be read)."""
        timeout = self.options.rpc_timeout_s
        snapshot = await self.scheduler.Snapshot(scheduler_pb2.SnapshotRequest(), timeout=timeout)
        active = await self.scheduler.Active(scheduler_pb2.ActiveRequest(), timeout=timeout)
        return convert.cluster_view(snapshot, active)

    def state_of(self, view: ClusterView) -> ScalingInput:
        models = managed_models(view, self.options.configured_models)
        profiles = model_profiles(models, view, self.options.profile_overrides, self.options.defaults)
        return scaling_input(view, self.book, profiles, self.options.gpu_budget)

    async def tick(self) -> ScalingDecision | None:
        now = self.clock.now()
        try:
            view = await self.read()
        except grpc.aio.AioRpcError as exc:
            self.last.error = f"scheduler unreadable: {exc.code().name}"
            logger.warning("tick skipped, the cluster is left as it is: %s", self.last.error)
            metrics.TICKS.labels(outcome="skipped").inc()
            return None
        self._worker_addresses = {w.worker_id: w.address for w in view.workers if w.address}
        observed = self.book.observe(view.workers, now)
        for replica_id in observed.ready:
            replica = self.book.get(replica_id)
            self._publish("ready", replica_id, replica.model if replica else "", "its worker registered")
        for replica_id in observed.overdue:
            await self._teardown_overdue(replica_id)
        state = self.state_of(view)
        await self._expect(sorted(state.models))
        decision = self.policy.tick(state, now)
        actions = plan_actions(decision, state)
        if actions.clamped != self._clamped:  # logged when it changes, not every tick
            for model, count in actions.clamped.items():
                logger.warning("%s: %d replica(s) beyond the GPU budget of %d wait", model, count, state.gpu_budget)
            self._clamped = actions.clamped
        for replica_id in actions.drain:
            await self._drain(replica_id, decision)
        for replica_id in actions.release:
            self._background.spawn(self._release(replica_id))
        for model, count in actions.start.items():
            profile = state.models.get(model) or ModelProfile(model, 1, 1.0, 0.0)
            for _ in range(count):
                # Booked now, before the platform answers, so the next tick counts its GPUs and does
                # not start it twice; a worker of the model that registers meanwhile is this replica.
                self._launches += 1
                launching = pending_id(model, f"launch-{self._launches}")
                self.book.provisioned(launching, model, profile.gpus_per_replica, now)
                self._background.spawn(self._start(model, launching, decision.reasons.get(model, "")))
        self.last = TickResult(state, decision, time.time())
        metrics.observe_tick(state, decision)
        return decision

    # ---- actions --------------------------------------------------------------------------------

    async def _expect(self, models: list[str]) -> None:
        """Keep the managed models schedulable at zero replicas (their requests wait)."""
        if models == self._expected:
            return
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.scheduler.ExpectModels(
                scheduler_pb2.ExpectModelsRequest(models=models), timeout=self.options.rpc_timeout_s
            )
            self._expected = models

    async def _drain(self, replica_id: str, decision: ScalingDecision) -> None:
        replica = self.book.get(replica_id)
        if replica is None:
            logger.info("not draining %s: this autoscaler did not start it", replica_id)
            return
        if not is_pending(replica_id):
            try:
                await self.scheduler.Drain(
                    scheduler_pb2.DrainRequest(worker_id=replica_id, drain=True),
                    timeout=self.options.rpc_timeout_s,
                )
            except grpc.aio.AioRpcError as exc:  # not excluded from routing: not draining yet
                logger.warning("drain of %s failed (%s); retried next tick", replica_id, exc.code().name)
                return
        self.book.draining(replica_id, self.clock.now())
        self._publish("drain", replica_id, replica.model, decision.reasons.get(replica.model, ""))
        address = self._worker_addresses.get(replica_id)
        if address:
            self._background.spawn(self._hand_back_queued(replica_id, address))

    async def _hand_back_queued(self, replica_id: str, address: str) -> None:
        """Ask the drained worker to hand back the calls still waiting in its engine queue, so
        that the gateway re-places them rather than they wait out the calls ahead of them there.
        Best effort: a worker that cannot be reached keeps them, and they finish there."""
        stub = worker_pb2_grpc.WorkerStub(self._worker_channel(address))
        try:
            reply = await stub.Drain(worker_pb2.WorkerDrainRequest(drain=True), timeout=self.options.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            logger.info("%s keeps its queued calls: its Drain failed (%s)", replica_id, exc.code().name)
            return
        logger.info("%s handed back %d queued calls to be re-placed", replica_id, reply.requeued)

    def _worker_channel(self, address: str) -> grpc.aio.Channel:
        chan = self._worker_channels.get(address)
        if chan is None:
            chan = self._worker_channels[address] = channel(address)
        return chan

    async def _close_worker_channel(self, replica_id: str) -> None:
        address = self._worker_addresses.get(replica_id)
        chan = self._worker_channels.pop(address, None) if address else None
        if chan is not None:
            await chan.close(grace=None)

    async def _start(self, model: str, launching: str, reason: str) -> None:
        try:
            replica_id = await self._background.retry(
                f"start a {model} replica", lambda: self.actuator.provision(model)
            )
        except ActuatorError as exc:
            self.book.released(launching)
            self._publish("failed", "", model, str(exc))
            return
        self.book.named(launching, replica_id)
        metrics.ACTIONS.labels(action="start").inc()
        logger.info("started %s (%s): %s", replica_id, model, reason)
        self._publish("started", replica_id, model, reason)

    async def _release(self, replica_id: str) -> None:
        replica = self.book.get(replica_id)
        if replica is None or replica_id in self._busy:
            return
        self._busy.add(replica_id)
        try:
            await self._background.retry(
                f"stop {replica_id}", lambda: self.actuator.release(replica_id, replica.model)
            )
        except ActuatorError as exc:
            self._publish("failed", replica_id, replica.model, str(exc))
            return
        finally:
            self._busy.discard(replica_id)
        self.book.released(replica_id)
        await self._close_worker_channel(replica_id)
        metrics.ACTIONS.labels(action="release").inc()
        logger.info("released %s (%s): drained and idle", replica_id, replica.model)
        self._publish("released", replica_id, replica.model, "drained and idle")

    async def _teardown_overdue(self, replica_id: str) -> None:
        """Not ready within its start-up allowance: excluded from routing should it still
        register, stopped, and counted."""
        replica = self.book.get(replica_id)
        if replica is None:
            return
        self.failed_starts_total += 1
        metrics.FAILED_STARTS.inc()
        logger.warning(
            "%s (%s) was not ready within %.0f s: torn down",
            replica_id,
            replica.model,
            self.options.startup_allowance_s,
        )
        self._publish("failed", replica_id, replica.model, "not ready within the start-up allowance")
        if not is_pending(replica_id):
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.scheduler.Drain(
                    scheduler_pb2.DrainRequest(worker_id=replica_id, drain=True),
                    timeout=self.options.rpc_timeout_s,
                )
        self.book.draining(replica_id, self.clock.now())
        self._background.spawn(self._release(replica_id))

    def _publish(self, kind: str, replica_id: str, model: str, reason: str) -> None:
        if self.bus is None:
            return
        event = autoscaler_pb2.ScalingEvent(
            kind=kind, replica_id=replica_id, model=model, time=time.time(), reason=reason
        )
        self._background.spawn(self.bus.publish(f"cv.scaling.{kind}", event.SerializeToString()))

    # ---- lifetime -------------------------------------------------------------------------------

    async def run_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # one bad tick must not end scaling for good
                logger.exception("scaling tick failed")
            await asyncio.sleep(self.options.interval_s)

    async def settle(self) -> None:
        """Wait for the starts and stops in flight (tests, shutdown)."""
        await self._background.settle()

    async def close(self) -> None:
        await self._background.close()
        channels, self._worker_channels = list(self._worker_channels.values()), {}
        for chan in channels:
            await chan.close(grace=None)
