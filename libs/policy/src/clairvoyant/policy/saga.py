"""SAGA's session-affinity batching and Agent Fair Share (seeds/003, §5–6): the ``saga`` preset.

    submit ──> AgentFairShare (§6.1–6.2)              ──> SagaAffinityRouting (§5.1)
               per tenant, once per 100 ms epoch:          the session's worker while its load < 0.8,
               share = AFS / Σ AFS, AFS = Σ W_t            else the least loaded one (the new pin)
               priority = share − capacity in use
    dispatch ─> SagaAffinityRouting.rebalance (§5.2): a worker whose queue has been empty for 100 ms
               steals the oldest pending session of a random worker loaded > 2.0× as much as it;
               the session's next placement names the victim as its KV source (step 3)

The paper's equations (7)–(9) did not survive in the seed's text, so the formulas below are
readings of the prose around them; each class's docstring says which.  Defaults are the paper's
(Table 9): load threshold 0.8, steal trigger 100 ms, load ratio 2.0, epoch 100 ms.

KV migration (§5.2 step 3): a steal re-pins the session to the thief and remembers the victim; the
session's next placement carries it as ``Decision.kv_source`` (the ``MigratesKv`` hook).  The caller
moves the KV: the live scheduler service streams the victim's ExportKV of the session into the
thief's ImportKV before it answers the call's Schedule, and the simulator waits the cost model's
transfer time; both recompute instead when the move fails (or, in the simulator, costs more).  AFS
preemption (§6.2 step 4) is the worker's: its local scheduler already preempts the least urgent
running call (by the base priority sent here) when seats or blocks run out, at once rather than
after the paper's delay, and it recomputes or swaps the victim's KV rather than migrating it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ChangeFeed, ProcessTable, ProgramKey, program_key
from clairvoyant.policy.pythia import trusted_annotations
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    PriorityChanges,
    SchedulerView,
    eligible_workers,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

_SLACK = 1e-9  # time differences are float: 1.1 - 1.0 must count as 100 ms


@dataclass(frozen=True, slots=True)
class SagaConfig:
    load_threshold: float = 0.8  # θ of §5.1 (Table 9: "20% headroom")
    steal_after_s: float = 0.1  # §5.2 trigger (1): the thief's queue empty this long
    steal_load_ratio: float = 2.0  # §5.2 trigger (2): victim load / thief load must exceed this
    epoch_s: float = 0.1  # §6.2: AFS is recomputed, and priorities change, once per epoch
    seed: int = 0  # the victim choice's generator (§5.2 step 1: uniformly at random)

    def __post_init__(self) -> None:
        if not 0.0 < self.load_threshold <= 1.0:
            raise ValueError("load_threshold must be in (0, 1]")
        if self.steal_after_s < 0 or self.steal_load_ratio < 1.0 or self.epoch_s <= 0:
            raise ValueError("steal_after_s >= 0, steal_load_ratio >= 1, epoch_s > 0")


def worker_load(worker: WorkerView, pending: int = 0) -> float:
    """A worker's load in [0, 1] while it has room: the larger of its seat use and its KV use.

    Seats = (placements + ``pending`` calls waiting for it) / admission capacity; KV = the reported
    fraction of blocks in use.  Reading: §5.1 takes its threshold from Llumnix's memory headroom,
    so KV counts; seats count too because KV reports arrive only with heartbeats, while placements
    change at once (a burst of new sessions would otherwise all see the same idle worker).
    """
    capacity = max(1, worker.admission_limit or worker.max_batch)
    return max((worker.placed + pending) / capacity, worker.kv_usage)


# ---- work stealing: §5.2 ----------------------------------------------------------------------


class PendingSession(NamedTuple):
    """A session with calls waiting in the global queue for the worker it is pinned to."""

    key: ProgramKey
    oldest_arrival: float  # arrival of its earliest waiting call: the session's age
    calls: int  # its waiting calls
    excluded: frozenset[str]  # workers one of those calls may not go to


class WorkerQueue(NamedTuple):
    """What the stealing decision reads of one worker."""

    worker: WorkerView
    pending: tuple[PendingSession, ...]  # sessions waiting for it, any order
    empty_since: float | None  # when its queue (pending + engine-reported) was last seen to empty


class Steal(NamedTuple):
    thief: str
    victim: str
    session: ProgramKey


def plan_steals(
    queues: Sequence[WorkerQueue], now: float, rng: random.Random, config: SagaConfig
) -> list[Steal]:
    """§5.2's steal decisions at ``now``; pure apart from drawing from ``rng``.

    A thief is a worker that is not draining and whose queue has been empty for at least
    ``steal_after_s`` (its seats may be full: it steals into its queue, as in the paper).  Thieves go in worker-id order and steal at most once each.  A victim serves
    the thief's model, holds a session the thief may take, and has load(victim) / load(thief) above
    ``steal_load_ratio`` (loads count the calls waiting for the worker; a thief with load 0 sees
    every loaded victim as over the ratio).  The victim is drawn uniformly from those, in id
    order; the session taken is its oldest (earliest waiting call, then key).  A stolen session's
    calls then count for the thief, whose queue is no longer empty.

    Reading: the paper lists the two triggers as "(1) … or (2)", but its thrashing safeguard (a)
    requires both at once; both are required here.
    """
    pending = {q.worker.worker_id: list(q.pending) for q in queues}
    calls = {wid: sum(s.calls for s in sessions) for wid, sessions in pending.items()}
    by_id = sorted(queues, key=lambda q: q.worker.worker_id)

    def load(worker: WorkerView) -> float:
        return worker_load(worker, calls[worker.worker_id])

    def over_ratio(victim: WorkerView, thief: WorkerView) -> bool:
        thief_load = load(thief)
        if thief_load == 0.0:
            return load(victim) > 0.0
        return load(victim) / thief_load > config.steal_load_ratio

    steals: list[Steal] = []
    for queue in by_id:
        thief = queue.worker
        if (
            queue.empty_since is None
            or now - queue.empty_since < config.steal_after_s - _SLACK
            or thief.draining
            or calls[thief.worker_id]
        ):
            continue
        victims = [
            q.worker
            for q in by_id
            if q.worker.worker_id != thief.worker_id
            and q.worker.model == thief.model
            and any(thief.worker_id not in s.excluded for s in pending[q.worker.worker_id])
            and over_ratio(q.worker, thief)
        ]
        if not victims:
            continue
        victim = rng.choice(victims)
        sessions = pending[victim.worker_id]
        session = min(
            (s for s in sessions if thief.worker_id not in s.excluded),
            key=lambda s: (s.oldest_arrival, s.key),
        )
        sessions.remove(session)
        calls[victim.worker_id] -= session.calls
        calls[thief.worker_id] += session.calls
        steals.append(Steal(thief.worker_id, victim.worker_id, session.key))
    return steals


# ---- routing: §5.1, with §5.2 at each dispatch ---------------------------------------------------


@ROUTING_POLICIES.register("saga-affinity")
class SagaAffinityRouting:
    """Session routing (§5.1) and randomised work stealing (§5.2).

    A session is a program of the process table, (tenant, workflow_id); its worker is the pin
    ``Program.engine_id`` (the one column this policy writes).

    - A call goes to its session's worker while that worker is usable (serves the model, not
      draining, not excluded), has room, and has ``worker_load`` below ``load_threshold``.
    - Otherwise it goes to the least loaded eligible worker (load, then the session's own worker,
      then fewer placements, then id), which becomes the session's worker.  Reading of Eq. 7 (lost
      in the seed): "least loaded" even when that worker is above the threshold too.  With no
      eligible worker the call waits, still pinned: it is a pending call of that worker.
    - A new session, and a call of no session, go to the least loaded eligible worker.

    ``rebalance`` (the scheduler's ``Rebalancing`` hook, at the start of every dispatch) samples
    each worker's queue: the global queue's calls whose session is pinned to it, plus the calls
    the worker reports queued at its engine.  A queue seen empty at one dispatch is taken to have
    been empty since then; so the 100 ms count from the first dispatch that sees it empty, not from
    the instant it emptied.  ``plan_steals`` decides; a steal re-pins the session to the thief.  The
    steals are kept in ``steals`` (all so far, in order) for diagnostics.

    Cost: the pending sessions are kept per worker and updated only for the programs whose waiting
    calls or pin changed since the previous dispatch (``GlobalScheduler.watch_queued_programs``,
    the process table's feed, and this policy's own re-pins), and ``plan_steals`` runs only when
    some worker has been empty long enough to steal; the decisions are those of a full scan, which
    ``cache = False`` restores (the tests compare the two).

    ``kv_source`` (the scheduler's ``MigratesKv`` hook) names the victim at the stolen session's
    next placement: the KV is still where the session ran (§5.2 step 3 migrates it "to" the thief
    before the affinity moves, step 4).  Readings: only that one placement migrates (later calls
    find the KV where the first one put it); it migrates to wherever the call lands, the thief or,
    when the thief has no room by then, the worker ``route`` moved the session to; none when it
    lands back on the victim.  A session stolen twice before it is placed keeps the first victim,
    which still holds its KV.

    What stealing changes here: the global queue binds calls late, so a waiting call already goes
    to any worker with room when its own worker is loaded (the rule above).  A call therefore waits
    pinned only while no eligible worker has room, and a steal changes whose pin a session holds
    (which worker its calls, and the later ones, go to), not whether a free seat is used.
    """

    capabilities = frozenset(
        {Capability.PROGRAM_AWARE, Capability.SCHEDULER_AWARE, Capability.REBALANCES, Capability.MIGRATES_KV}
    )

    def __init__(self, config: SagaConfig | None = None) -> None:
        self.config = config or SagaConfig()
        self.programs = ProcessTable()  # replaced by the scheduler's own in bind_programs
        self.steals: list[Steal] = []
        self._kv_at: dict[ProgramKey, str] = {}  # stolen sessions not placed since: their victim
        self._rng = random.Random(self.config.seed)
        self._scheduler: SchedulerView | None = None
        self._empty_since: dict[str, float] = {}
        # Pending sessions: program -> (its worker, the session), and per worker; the feeds say
        # which programs to look at again, ``_repinned`` the ones this policy moved.
        self._pending_of: dict[ProgramKey, tuple[str, PendingSession]] = {}
        self._pending: dict[str, dict[ProgramKey, PendingSession]] = {}
        self._feeds: tuple[ChangeFeed, ChangeFeed] | None = None
        self._repinned: set[ProgramKey] = set()
        self.cache = True  # False: rescan every queued call and run plan_steals at every dispatch

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table

    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        self._scheduler = scheduler

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        program = self.programs.get(program_key(request))
        pin = program.engine_id if program is not None else None
        pinned = next((w for w in workers if w.worker_id == pin), None) if pin is not None else None
        if (
            pinned is not None
            and pinned in eligible_workers(request, [pinned])
            and worker_load(pinned) < self.config.load_threshold
        ):
            return pinned.worker_id
        candidates = eligible_workers(request, workers)
        if not candidates:
            return None
        chosen = min(
            candidates, key=lambda w: (worker_load(w), w.worker_id != pin, w.placed, w.worker_id)
        ).worker_id
        if program is not None and program.engine_id != chosen:
            program.engine_id = chosen
            self._repinned.add(program.key)
        return chosen

    def rebalance(self, now: float) -> None:
        self.steal(now)

    def kv_source(self, request: QueuedRequest, worker_id: str) -> str | None:
        key = program_key(request) if self._kv_at else None
        victim = self._kv_at.pop(key, None) if key is not None else None
        return victim if victim != worker_id else None

    def steal(self, now: float) -> list[Steal]:
        """Sample the queues, decide (``plan_steals``) and re-pin; the steals made at ``now``."""
        if self._scheduler is None:
            return []
        self._update_pending(self._scheduler)
        workers = self._scheduler.workers()
        may_steal = False
        for worker in workers:
            wid = worker.worker_id
            if self._pending.get(wid) or worker.queued:
                self._empty_since.pop(wid, None)
            else:
                since = self._empty_since.setdefault(wid, now)
                may_steal |= not worker.draining and now - since >= self.config.steal_after_s - _SLACK
        live = {w.worker_id for w in workers}
        for gone in set(self._empty_since) - live:
            del self._empty_since[gone]
        steals: list[Steal] = []
        if may_steal or not self.cache:  # else no thief: plan_steals would take nothing (and draw nothing)
            queues = [
                WorkerQueue(
                    w, tuple(self._pending.get(w.worker_id, {}).values()), self._empty_since.get(w.worker_id)
                )
                for w in workers
            ]
            steals = plan_steals(queues, now, self._rng, self.config)
        for steal in steals:
            program = self.programs.get(steal.session)
            assert program is not None
            program.engine_id = steal.thief
            self._repinned.add(steal.session)
            self._kv_at.setdefault(steal.session, steal.victim)
        for ended in [key for key in self._kv_at if self.programs.get(key) is None]:
            del self._kv_at[ended]  # the session ended before a call of it was placed again
        self.steals += steals
        return steals

    def _update_pending(self, scheduler: SchedulerView) -> None:
        """Bring the pending sessions up to date for the programs that changed since last time."""
        if self._feeds is None or not self.cache:
            if self._feeds is None:
                self._feeds = (scheduler.watch_queued_programs(), self.programs.subscribe())
            changed = set(scheduler.queued_programs()) | set(self._pending_of)
        else:
            changed = self._feeds[0].take() | self._feeds[1].take()
        changed |= self._repinned
        self._repinned = set()
        for key in changed:
            held = self._pending_of.pop(key, None)
            if held is not None:
                sessions = self._pending[held[0]]
                del sessions[key]
                if not sessions:
                    del self._pending[held[0]]
            program = self.programs.get(key)
            calls = (
                scheduler.queued_calls(key) if program is not None and program.engine_id is not None else []
            )
            if program is None or program.engine_id is None or not calls:
                continue
            session = PendingSession(
                key,
                min(r.arrival_time for r in calls),
                len(calls),
                frozenset().union(*(r.exclude_workers for r in calls)),
            )
            self._pending_of[key] = (program.engine_id, session)
            self._pending.setdefault(program.engine_id, {})[key] = session


# ---- priority: Agent Fair Share, §6 --------------------------------------------------------------


class TaskWork(NamedTuple):
    tenant: str
    remaining_s: float | None  # W_t; None when the task's calls carry no trusted estimate


def agent_fair_shares(tasks: Sequence[TaskWork]) -> dict[str, float]:
    """Each tenant's share of capacity: AFS_i / Σ_j AFS_j, with AFS_i = Σ W_t over i's tasks.

    Reading of Eq. 8–9 (lost in the seed): AFS sums the remaining GPU-seconds of the tenant's
    active tasks ("urgency … monotonically increasing in remaining work"), and capacity is shared
    in proportion (§6.2 step 2).  A task without an estimate counts as the mean of those with one
    (1 s when none has one), so it neither gains nor loses.  When every AFS is 0 the shares are
    equal.
    """
    known = [t.remaining_s for t in tasks if t.remaining_s is not None]
    fallback = sum(known) / len(known) if known else 1.0
    afs: dict[str, float] = {}
    for task in tasks:
        work = fallback if task.remaining_s is None else max(0.0, task.remaining_s)
        afs[task.tenant] = afs.get(task.tenant, 0.0) + work
    total = sum(afs.values())
    if total == 0.0:
        return {tenant: 1.0 / len(afs) for tenant in afs}
    return {tenant: value / total for tenant, value in afs.items()}


def epoch_of(now: float, epoch_s: float) -> int:
    """The epoch ``now`` falls in: [k × epoch_s, (k + 1) × epoch_s); 0.3 s is in epoch 3 of 0.1 s."""
    return math.floor(now / epoch_s + _SLACK)


@PRIORITY_POLICIES.register("saga-afs")
class AgentFairShare:
    """Agent Fair Share (§6.1–6.2): per tenant, share of capacity minus capacity in use.

    At the first evaluation in each epoch (``epoch_of(now)``) it recomputes, from the calls the
    scheduler holds (queued and placed), every tenant's share (``agent_fair_shares``) and its use:
    its placements / the admission capacity of the live, undrained workers.  priority = share − use,
    fixed until the next epoch.  So a tenant below its share goes first (§6.3's restoring drift),
    and on an idle cluster the tenant with the most remaining work goes first (§6.2 step 3).

    Readings:
    - a task is a program, (tenant, workflow_id), or a call of no program on its own; it is active
      while one of its calls is queued or placed (a task inside a tool call needs no capacity now);
    - W_t is ``expected_remaining_time_s`` of the task's latest call, when its annotations are
      trusted (LOW or HIGH, as for pythia); otherwise the fallback of ``agent_fair_shares``;
    - a tenant first seen inside an epoch gets priority 0 until the next one;
    - within a tenant, the scheduler's own order (arrival, then submission) decides;
    - preemption (§6.2 step 4) is the engine's: it preempts the least urgent running call by the
      base priority sent here, immediately, when seats or blocks run out.

    Incremental ranking (``IncrementalPriority``): the values change only when an epoch's
    recomputation gives a tenant another value; ``priority_changes`` does that recomputation at
    the ranking where ``priority`` would have (the first in the epoch) and names every queued call
    when some tenant's value moved, none otherwise.
    """

    capabilities = frozenset({Capability.SCHEDULER_AWARE, Capability.INCREMENTAL_PRIORITY})

    def __init__(self, config: SagaConfig | None = None) -> None:
        self.config = config or SagaConfig()
        self.shares: dict[str, float] = {}  # of the current epoch, for diagnostics and tests
        self._priorities: dict[str, float] = {}
        self._epoch: int | None = None
        self._scheduler: SchedulerView | None = None
        self._ranked_with: dict[str, float] | None = None  # the values of the previous ranking

    def bind_scheduler(self, scheduler: SchedulerView) -> None:
        self._scheduler = scheduler

    def priority(self, request: QueuedRequest, now: float) -> float:
        self._enter_epoch(now)
        return self._priorities.get(request.tenant, 0.0)

    def priority_changes(self, now: float) -> PriorityChanges:
        self._enter_epoch(now)
        before, self._ranked_with = self._ranked_with, self._priorities
        if before is None:
            return PriorityChanges(everything=True)
        if before is self._priorities:
            return PriorityChanges()
        tenants = before.keys() | self._priorities.keys()
        moved = any(before.get(t, 0.0) != self._priorities.get(t, 0.0) for t in tenants)
        return PriorityChanges(everything=moved)

    def _enter_epoch(self, now: float) -> None:
        epoch = epoch_of(now, self.config.epoch_s)
        if epoch != self._epoch:
            self._epoch = epoch
            self._recompute()

    def _recompute(self) -> None:
        scheduler = self._scheduler
        if scheduler is None:
            self.shares, self._priorities = {}, {}
            return
        workers = scheduler.workers()
        placed = [r for w in workers for r in scheduler.placed_requests(w.worker_id)]
        latest: dict[tuple[str, str], QueuedRequest] = {}
        for request in [*placed, *scheduler.queued_requests()]:
            meta = request.app_metadata
            task = (request.tenant, meta.workflow_id if meta is not None else "request:" + request.request_id)
            held = latest.get(task)
            if held is None or request.arrival_time >= held.arrival_time:
                latest[task] = request
        tasks = []
        for request in latest.values():
            annotations = trusted_annotations(request)
            remaining = (
                annotations.expected_remaining_time_s
                if annotations is not None and annotations.expected_remaining_time_s is not None
                else None
            )
            tasks.append(TaskWork(request.tenant, remaining))
        self.shares = agent_fair_shares(tasks)
        capacity = sum(max(1, w.admission_limit or w.max_batch) for w in workers if not w.draining)
        in_use: dict[str, int] = {}
        for request in placed:
            in_use[request.tenant] = in_use.get(request.tenant, 0) + 1
        self._priorities = {
            tenant: share - (in_use.get(tenant, 0) / capacity if capacity else 0.0)
            for tenant, share in self.shares.items()
        }


PRESETS.register_preset("saga", Preset("saga-afs", "saga-affinity", cache="saga"))
