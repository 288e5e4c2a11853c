"""The replicas the autoscaler started, and where each one stands: starting, ready, draining.

Pure: every call takes ``now``.  A replica is provisioned under the worker id its actuator
returned, or a ``pending:`` id when the platform names it later; a pending replica is matched to
the first worker of its model that registers with the scheduler and that nobody owned before.
Workers the autoscaler did not start (``make run``'s, an operator's) are *unowned*: they count as
capacity, and are never drained or stopped by it.

    provisioned ──(its worker reports)──> READY ──drain──> DRAINING ──release──> (gone)
         │ no report within the start-up allowance: overdue (torn down and counted)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.policy.scaling import ReplicaPhase, ReplicaState

PENDING_PREFIX = "pending:"


def pending_id(model: str, n: int | str) -> str:
    """A replica not named yet: by the platform, or (``launch-<n>``) while it is being started."""
    return f"{PENDING_PREFIX}{model}:{n}"


def is_pending(replica_id: str) -> bool:
    return replica_id.startswith(PENDING_PREFIX)


class WorkerSeen(NamedTuple):
    """One worker in the scheduler's snapshot, as the autoscaler reads it."""

    worker_id: str
    model: str
    placed: int  # placements the scheduler holds on it
    running: int
    waiting: int  # in its engine queue
    kv_utilization: float
    draining: bool
    max_batch: int
    address: str = ""  # its Worker gRPC endpoint (host:port); "" when the scheduler has none


@dataclass
class OwnedReplica:
    replica_id: str
    model: str
    gpus: int
    phase: ReplicaPhase
    since: float


class Observed(NamedTuple):
    ready: list[str]  # became ready in this observation
    gone: list[str]  # owned, once registered, and no longer in the snapshot
    overdue: list[str]  # starting for longer than the start-up allowance


class ReplicaBook:
    def __init__(self, startup_allowance_s: float) -> None:
        self.startup_allowance_s = startup_allowance_s
        self._owned: dict[str, OwnedReplica] = {}
        self._seen: set[str] = set()  # worker ids ever seen in a snapshot

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._owned

    def owned(self) -> list[OwnedReplica]:
        return sorted(self._owned.values(), key=lambda r: r.replica_id)

    def get(self, replica_id: str) -> OwnedReplica | None:
        return self._owned.get(replica_id)

    def provisioned(self, replica_id: str, model: str, gpus: int, now: float) -> None:
        self._owned[replica_id] = OwnedReplica(replica_id, model, gpus, ReplicaPhase.STARTING, now)

    def named(self, launching_id: str, replica_id: str) -> None:
        """The platform named a replica booked under ``launching_id`` (no-op if a registering
        worker was matched to it meanwhile, or the ids are equal)."""
        replica = self._owned.get(launching_id)
        if replica is None or launching_id == replica_id:
            return
        del self._owned[launching_id]
        replica.replica_id = replica_id
        self._owned[replica_id] = replica

    def draining(self, replica_id: str, now: float) -> None:
        replica = self._owned.get(replica_id)
        if replica is not None and replica.phase is not ReplicaPhase.DRAINING:
            replica.phase, replica.since = ReplicaPhase.DRAINING, now

    def released(self, replica_id: str) -> None:
        self._owned.pop(replica_id, None)

    def observe(self, workers: Iterable[WorkerSeen], now: float) -> Observed:
        """Match the scheduler's workers against the book."""
        present = {w.worker_id: w for w in workers}
        ready: list[str] = []
        for worker in present.values():
            replica = self._owned.get(worker.worker_id)
            if replica is None and worker.worker_id not in self._seen:
                replica = self._adopt_pending(worker)
            if replica is not None and replica.phase is ReplicaPhase.STARTING:
                replica.phase, replica.since = ReplicaPhase.READY, now
                ready.append(replica.replica_id)
        self._seen |= present.keys()
        gone = [
            r.replica_id
            for r in self.owned()
            if r.replica_id not in present and r.phase is not ReplicaPhase.STARTING
        ]
        for replica_id in gone:
            del self._owned[replica_id]
        overdue = [
            r.replica_id
            for r in self.owned()
            if r.phase is ReplicaPhase.STARTING and now - r.since > self.startup_allowance_s
        ]
        return Observed(ready, gone, overdue)

    def _adopt_pending(self, worker: WorkerSeen) -> OwnedReplica | None:
        """A new worker of a model with a pending replica is that replica: it takes the worker id."""
        pending = [
            r for r in self.owned() if r.model == worker.model and is_pending(r.replica_id)
        ]
        if not pending:
            return None
        replica = min(pending, key=lambda r: (r.since, r.replica_id))
        del self._owned[replica.replica_id]
        replica.replica_id = worker.worker_id
        self._owned[worker.worker_id] = replica
        return replica

    def states(self, workers: Sequence[WorkerSeen], gpus_of: dict[str, int]) -> list[ReplicaState]:
        """Every replica for the scaling policy: owned ones with their phase, unowned workers as
        ready (or draining, when an operator drained them), each with its load."""
        present = {w.worker_id: w for w in workers}
        states: list[ReplicaState] = []
        for replica in self.owned():
            worker = present.get(replica.replica_id)
            states.append(
                _state(replica.replica_id, replica.model, replica.gpus, worker, replica.phase, replica.since)
            )
        for worker in workers:
            if worker.worker_id not in self._owned:
                phase = ReplicaPhase.DRAINING if worker.draining else ReplicaPhase.READY
                states.append(
                    _state(worker.worker_id, worker.model, gpus_of.get(worker.model, 1), worker, phase, 0.0)
                )
        return states


def _state(
    replica_id: str, model: str, gpus: int, worker: WorkerSeen | None, phase: ReplicaPhase, since: float
) -> ReplicaState:
    if worker is None:
        return ReplicaState(replica_id, model, gpus, phase=phase, since=since)
    return ReplicaState(
        replica_id,
        model,
        gpus,
        running=max(worker.placed, worker.running + worker.waiting),
        waiting=worker.waiting,
        kv_utilization=worker.kv_utilization,
        phase=phase,
        since=since,
    )
