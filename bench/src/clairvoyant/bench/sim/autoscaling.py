"""The autoscaler in the simulator: a scaling policy's pure core, ticking in virtual time.

    every interval_s:  replicas + scheduler ──ScalingInput──> policy.tick ──plan_actions──>
        start   a replica is provisioned; it joins the scheduler once its cold start (startup_s) is over
        drain   scheduler.drain: no new placements; the calls it runs finish, and those still
                waiting in its engine are placed again elsewhere (Simulator.hand_back_waiting)
        release a draining replica that is idle (or one still starting) leaves: remove_worker

The GPUs of starting, ready and draining replicas count against the budget, which
``plan_actions`` keeps to.  Deterministic: ticks come after every event due at their time
(``Simulator.attach``), and nothing here reads a clock or draws a random number.  ``ScalingLog``
is what a run records: GPU-seconds held, replicas per model over time, scale-ups, drains, releases
and the calls re-placed off drained replicas.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

from clairvoyant.bench.sim.events import Phase
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.policy.scaling import (
    ModelProfile,
    ReplicaPhase,
    ReplicaState,
    ScalingActions,
    ScalingInput,
    ScalingPolicy,
    plan_actions,
)
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel

DEFAULT_INTERVAL_S = 5.0
KNEE_CONTEXT_TOKENS = 4096  # the "typical context" a replica's knee is measured at
KNEE_SLOWDOWN = 1.5  # the knee: the largest batch whose decode step stays within this x batch 1


def model_profile(
    model: str, cost: CostModel, *, kv_capacity_tokens: int, max_num_seqs: int, max_num_batched_tokens: int
) -> ModelProfile:
    """What the autoscaler knows of one model's replicas, from the emulated runner's cost model.

    ``calls_per_replica`` is the knee: the largest batch (up to ``max_num_seqs``) whose decode
    step at ``KNEE_CONTEXT_TOKENS`` of context per call takes at most ``KNEE_SLOWDOWN`` x the
    batch-1 step, and no more calls than the KV pool holds at that context.  ``decode_step_s`` is
    the step at the knee; ``prefill_tokens_per_s`` one full prefill chunk's throughput.
    """

    def decode_step(batch: int) -> float:
        return cost.step_cost([BatchItem(1, KNEE_CONTEXT_TOKENS)] * batch).seconds

    single = decode_step(1)
    fits = max(1, min(max_num_seqs, kv_capacity_tokens // (KNEE_CONTEXT_TOKENS + 1)))
    low, high = 1, fits  # the step grows with the batch: bisect for the last batch under the bound
    while low < high:
        middle = (low + high + 1) // 2
        if decode_step(middle) <= KNEE_SLOWDOWN * single:
            low = middle
        else:
            high = middle - 1
    prefill = cost.step_cost([BatchItem(max_num_batched_tokens, 0)]).seconds
    return ModelProfile(
        model=model,
        gpus_per_replica=cost.tp,
        calls_per_replica=float(low),
        startup_s=cost.startup_time(),
        prefill_tokens_per_s=max_num_batched_tokens / prefill,
        decode_step_s=decode_step(low),
    )


@dataclass
class _Held:
    """A replica the autoscaler holds (its GPUs count against the budget)."""

    model: str
    gpus: int
    phase: ReplicaPhase
    since: float
    joined: bool  # in the simulator and the scheduler (False while starting)


class TickRecord(NamedTuple):
    """What one tick saw and did."""

    time: float
    gpus_held: int  # starting + ready + draining, after the tick's actions
    actions: ScalingActions


@dataclass
class ScalingLog:
    """What the autoscaler did over a run; GPU-seconds are final once ``SimAutoscaler.finish`` ran."""

    gpu_seconds: float = 0.0  # the integral of GPUs held (starting, ready, draining) over the run
    deferred_releases: int = 0  # releases put off a tick: the drained replica's engine still worked
    scale_ups: int = 0  # replicas started
    drains: int = 0
    releases: int = 0
    clamped_ticks: int = 0  # ticks whose scale-up the budget held back
    replaced_calls: int = 0  # calls waiting in a drained replica's engine, placed again elsewhere
    # model -> [[time, ready replicas, all replicas (starting, ready, draining)], ...] on change
    replicas: dict[str, list[list[float]]] = field(default_factory=dict)
    ticks: list[TickRecord] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The results file's ``autoscaling`` entry (the ticks stay out: one per interval)."""
        return {
            "gpu_seconds": self.gpu_seconds,
            "scale_ups": self.scale_ups,
            "drains": self.drains,
            "releases": self.releases,
            "clamped_ticks": self.clamped_ticks,
            "replaced_calls": self.replaced_calls,
            "replica_series": self.replicas,
            **({"deferred_releases": self.deferred_releases} if self.deferred_releases else {}),
        }


class SimAutoscaler:
    """Runs ``policy`` every ``interval_s`` virtual seconds on ``simulator`` (a ``Ticker``).

    ``new_replica(model, replica_id)`` builds a replica as the cluster's were built.  The
    simulator's replicas at construction are the initial ones, ready at time 0; every model in
    ``profiles`` stays schedulable with no replica (its calls wait in the global queue).
    ``agent_models``: (workflow type, agent) -> model as known beforehand (the workload's spec);
    what the scheduler has seen since overrides it.  ``hand_back``: a drained replica's calls
    that have not started are placed again elsewhere at once (off: they wait for it).
    """

    def __init__(
        self,
        simulator: Simulator,
        policy: ScalingPolicy,
        profiles: Mapping[str, ModelProfile],
        gpu_budget: int,
        new_replica: Callable[[str, str], ReplicaSpec],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        agent_models: Mapping[tuple[str, str], str] | None = None,
        hand_back: bool = True,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.simulator = simulator
        self.scheduler = simulator.scheduler
        self.policy = policy
        self.profiles = dict(profiles)
        self.gpu_budget = gpu_budget
        self.new_replica = new_replica
        self.interval_s = interval_s
        self.seeded_agent_models = dict(agent_models or {})
        self.hand_back = hand_back
        self.log = ScalingLog()
        self._held: dict[str, _Held] = {}
        self._numbered: dict[str, int] = {}  # model -> replicas named so far
        self._gpus_held = 0
        self._changed_at = 0.0  # when _gpus_held last changed
        self._next = 0.0
        for replica_id, replica in simulator.replicas.items():
            profile = self.profiles.get(replica.model)
            gpus = profile.gpus_per_replica if profile is not None else 1
            self._held[replica_id] = _Held(replica.model, gpus, ReplicaPhase.READY, 0.0, joined=True)
            self._numbered[replica.model] = self._numbered.get(replica.model, 0) + 1
            self._gpus_held += gpus
        if self._gpus_held > gpu_budget:
            raise ValueError(f"the initial replicas hold {self._gpus_held} GPUs, over the budget of {gpu_budget}")
        for model in sorted({*self.profiles, *(h.model for h in self._held.values())}):
            self._record_replicas(model, 0.0)
        self.scheduler.expect_models(sorted(self.profiles))
        simulator.attach(self)

    # ---- the Ticker ------------------------------------------------------------------------------

    @property
    def next_tick(self) -> float:
        return self._next

    def tick(self) -> None:
        now = self.simulator.events.now
        self._next = now + self.interval_s
        state = self.scaling_input(now)
        actions = plan_actions(self.policy.tick(state, now), state)
        for replica_id in actions.drain:
            self._drain(replica_id, now)
        if self.hand_back:  # after every drain: no call is handed to a replica drained next
            joined = [rid for rid in actions.drain if self._held[rid].joined]
            self.log.replaced_calls += len(self.simulator.hand_back_waiting(joined))
        released: list[str] = []
        for replica_id in actions.release:
            held = self._held[replica_id]
            if held.joined and not self.simulator.replica_idle(replica_id):
                # No call is placed on it, but its engine still works (a pre-prefill the cache
                # manager sent, or the step in flight): it stays draining, released at a later tick.
                self.log.deferred_releases += 1
                continue
            self._release(replica_id, now)
            released.append(replica_id)
        started: dict[str, int] = {}
        clamped = dict(actions.clamped)
        for model, count in sorted(actions.start.items()):
            for _ in range(count):
                if self._gpus_held + self.profiles[model].gpus_per_replica > self.gpu_budget:
                    clamped[model] = clamped.get(model, 0) + 1  # the plan counted a put-off release's GPUs free
                    continue
                self._start(model, now)
                started[model] = started.get(model, 0) + 1
        self.log.clamped_ticks += bool(clamped)
        # What was done: the plan, less what waits for a release put off.
        actions = actions._replace(start=started, release=tuple(released), clamped=clamped)
        self.log.ticks.append(TickRecord(now, self._gpus_held, actions))

    def finish(self, end: float) -> ScalingLog:
        """The run ended at ``end``: count the GPUs held until then."""
        self._account(end)
        return self.log

    # ---- what the policy sees --------------------------------------------------------------------

    def scaling_input(self, now: float) -> ScalingInput:
        """The autoscaler's view at ``now``; reading it changes nothing in the run."""
        states = []
        for replica_id, held in sorted(self._held.items()):
            running = waiting = 0
            kv = 0.0
            if held.joined:
                stats = self.simulator.replicas[replica_id].engine.stats()
                running = len(self.scheduler.placed_requests(replica_id))
                waiting = stats.waiting
                kv = stats.kv_blocks_used / stats.kv_blocks_total if stats.kv_blocks_total else 0.0
            states.append(
                ReplicaState(
                    replica_id=replica_id, model=held.model, gpus=held.gpus, running=running,
                    waiting=waiting, kv_utilization=kv, phase=held.phase, since=held.since,
                )  # fmt: skip
            )
        queued = {model: 0 for model in self.profiles}
        queued.update(self.scheduler.queue_depths())
        return ScalingInput(
            replicas=tuple(states),
            queued=queued,
            gpu_budget=self.gpu_budget,
            models=self.profiles,
            active=tuple(self.scheduler.active_calls(now)),
            agent_models={**self.seeded_agent_models, **self.scheduler.agent_models()},
            traffic=self.scheduler.traffic(),
        )

    # ---- actions ---------------------------------------------------------------------------------

    def _start(self, model: str, now: float) -> None:
        number = self._numbered.get(model, 0)
        self._numbered[model] = number + 1
        replica_id = f"{model}-{number}"
        profile = self.profiles[model]
        self._account(now)
        self._held[replica_id] = _Held(model, profile.gpus_per_replica, ReplicaPhase.STARTING, now, joined=False)
        self._gpus_held += profile.gpus_per_replica
        self.log.scale_ups += 1
        self._record_replicas(model, now)
        self.simulator.events.at(now + profile.startup_s, Phase.READY, partial(self._join, replica_id))

    def _join(self, replica_id: str) -> None:
        held = self._held.get(replica_id)
        if held is None or held.phase is not ReplicaPhase.STARTING:
            return  # released while starting
        now = self.simulator.events.now
        held.phase, held.since, held.joined = ReplicaPhase.READY, now, True
        self._record_replicas(held.model, now)
        self.simulator.add_replica(self.new_replica(held.model, replica_id))

    def _drain(self, replica_id: str, now: float) -> None:
        held = self._held[replica_id]
        held.phase, held.since = ReplicaPhase.DRAINING, now
        if held.joined:
            self.scheduler.drain(replica_id)
        self.log.drains += 1
        self._record_replicas(held.model, now)

    def _release(self, replica_id: str, now: float) -> None:
        held = self._held.pop(replica_id)
        if held.joined:
            self.simulator.remove_replica(replica_id)
        self._account(now)
        self._gpus_held -= held.gpus
        self.log.releases += 1
        self._record_replicas(held.model, now)

    # ---- the log ---------------------------------------------------------------------------------

    def _account(self, now: float) -> None:
        self.log.gpu_seconds += self._gpus_held * (now - self._changed_at)
        self._changed_at = now

    def _record_replicas(self, model: str, now: float) -> None:
        mine = [h for h in self._held.values() if h.model == model]
        ready = sum(h.phase is ReplicaPhase.READY for h in mine)
        series = self.log.replicas.setdefault(model, [])
        point = [now, ready, len(mine)]
        if series and series[-1][0] == now:
            series[-1] = point  # several changes at one instant: the last state counts
        elif not series or series[-1][1:] != point[1:]:
            series.append(point)


def replicas_at(series: list[list[float]], time: float) -> tuple[int, int]:
    """(ready, all) replicas of one model at ``time`` from its ``ScalingLog.replicas`` series."""
    ready = total = 0
    for when, ready_now, total_now in series:
        if when > time:
            break
        ready, total = int(ready_now), int(total_now)
    return ready, total


def fitting_counts(wanted: Mapping[str, int], gpus_per_replica: Mapping[str, int], budget: int) -> dict[str, int]:
    """Replicas per model from ``wanted`` that fit ``budget`` GPUs: taken one at a time,
    round-robin over the models in name order (every model's first replica before any model's
    second), skipping one that does not fit the GPUs left."""
    counts = {model: 0 for model in wanted}
    left = budget
    for round_ in range(max(wanted.values(), default=0)):
        for model in sorted(wanted):
            if wanted[model] > round_ and gpus_per_replica[model] <= left:
                counts[model] += 1
                left -= gpus_per_replica[model]
    return counts


__all__ = [
    "DEFAULT_INTERVAL_S",
    "KNEE_CONTEXT_TOKENS",
    "KNEE_SLOWDOWN",
    "ScalingLog",
    "SimAutoscaler",
    "TickRecord",
    "fitting_counts",
    "model_profile",
    "replicas_at",
]
