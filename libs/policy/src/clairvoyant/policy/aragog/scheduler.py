"""Aragog's runtime scheduler (seeds/002 §3.2, with the §3.1 budget) as the core of a
``ModelAssigning`` routing policy; policy.py registers it with each configuration-set strategy.

    queued(call) ──> first call of its workflow: configuration set from the strategy; the
                     workflow's calls wait (``wake_at``) while the router search runs
                 ──> meta-queue (metaqueue.py): FIFO by workflow, deepest agent first (graph.py)
    assign(group) ─> free slots per replica ──> beam search over the calls that could use them
                     (beam.py) ──> placements; each placed call prunes its workflow's set

Readings where the seed leaves a choice (the modules named above document theirs):
- A workflow is (group, tenant, workflow_id); a call without app_metadata is a workflow of its
  own.  A call without app_metadata, or of a workflow type or agent the group does not declare,
  runs on the group's reference model only.
- Routing budget = max(EMA of the first calls' queue times, ``min_budget_s``).  45 ms is our
  floor: the seed's measured per-request routing latency (42.6-44.9 ms), so a search on an idle
  cluster still gets the time the seed's routers take.  The EMA learns each workflow's first call's
  queue time (assignment - arrival) when it is assigned.
- Slots and gains: a replica's free slots are min(profiled saturation, its admission limit) minus
  the scheduler's placements on it, and the gain of its next call is ``EngineProfile.gain`` at
  that occupancy.  A model without a profile saturates at the worker's max_batch, every free slot
  gaining 1 (U then counts placements).
- Depth: learned from ``parent_request_ids`` (``AgentGraph``) for the agents the group declares,
  unless ``depths`` is given; a call's depth is read when it is queued.
- Memory: a workflow is forgotten when it has no call queued and either its last assigned call
  said ``workflow_end``, it is a single call without app_metadata, or ``workflow_idle_ttl_s`` has
  passed since its last call was queued or assigned (the policy never hears of completions, so a
  call running longer than that has its workflow routed afresh if it comes back).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import ModelGroup, ModelGroups
from clairvoyant.policy.aragog.beam import Replica, Stage, StageOption, beam_assign
from clairvoyant.policy.aragog.graph import AgentGraph
from clairvoyant.policy.aragog.metaqueue import MetaQueue, Order
from clairvoyant.policy.aragog.strategies import ConfigSetStrategy, SearchStats
from clairvoyant.policy.aragog.types import EngineProfile
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.scheduling import Assignment, least_used_eligible
from clairvoyant.policy.types import QueuedRequest, WorkerView

_SLACK = 1e-9  # a first call assigned the moment its search ends waited exactly its routing time


@dataclass(eq=False)
class _Workflow:
    key: Hashable  # (group, tenant, workflow id), or the request id of a call without app_metadata
    group: ModelGroup
    space: ConfigSpace | None  # None: its calls run on the group's reference model
    rank: int  # FIFO rank of its first arrival
    mask: int  # its configuration set, pruned by every placement
    ready_at: float  # its calls are assignable from then (the router search has run)
    released: bool  # its queued calls are in the meta-queue
    first_call: str | None  # the first call's id until it is assigned (the budget's EMA)
    last_active: float
    routing_s: float = 0.0  # how long its configuration search took
    queued: set[str] = field(default_factory=set)
    agent_of: dict[str, str] = field(default_factory=dict)  # its calls' agents, for parent ids
    ended: bool = False  # a call said workflow_end


class _Call(NamedTuple):
    request: QueuedRequest
    workflow: _Workflow
    agent: str | None  # None: not an agent of the workflow's space (reference model only)
    order: Order


class StageScheduler:
    """The meta-queue and beam search of §3.2, with the configuration sets from ``strategy``."""

    capabilities = frozenset({Capability.ASSIGNS_MODELS, Capability.WAKES})

    def __init__(
        self,
        strategy: ConfigSetStrategy,
        groups: ModelGroups | None = None,
        profiles: Mapping[str, EngineProfile] | None = None,
        beam_width: int = 4,
        min_budget_s: float = 0.045,
        queue_ema_alpha: float = 0.1,
        depths: Mapping[tuple[str, str], int] | None = None,
        workflow_idle_ttl_s: float = 600.0,
    ) -> None:
        if beam_width < 1 or min_budget_s < 0 or not 0 < queue_ema_alpha <= 1 or workflow_idle_ttl_s < 0:
            raise ValueError("beam_width >= 1, min_budget_s >= 0, 0 < queue_ema_alpha <= 1, workflow_idle_ttl_s >= 0")
        self.strategy = strategy
        self.groups = groups or ModelGroups()
        self.profiles = dict(profiles or {})
        self.beam_width = beam_width
        self.min_budget_s = min_budget_s
        self.queue_ema_alpha = queue_ema_alpha
        self.workflow_idle_ttl_s = workflow_idle_ttl_s
        self.queue_ema_s: float | None = None  # EMA of first calls' queue times
        self.graph = AgentGraph(depths)
        self._members = self.groups.members()
        self._queues = {name: MetaQueue() for name in self._members}
        self._calls: dict[str, _Call] = {}
        self._workflows: dict[Hashable, _Workflow] = {}
        self._pending: list[tuple[float, int, Hashable]] = []  # (ready_at, rank, key), a heap
        self._idle: OrderedDict[Hashable, float] = OrderedDict()  # no call queued: key -> since
        self._ranks = itertools.count()
        self._sequence = itertools.count()
        self._now = 0.0  # the latest time a hook was told
        self._searches = SearchStats()

    # ---- hooks ----------------------------------------------------------------------------------

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        """A call of a served model (not a group): the least used eligible worker."""
        best = least_used_eligible(request, workers)
        return None if best is None else best.worker_id

    def group_models(self) -> Mapping[str, frozenset[str]]:
        return self._members

    def budget_s(self) -> float:
        """The time a new workflow's router search may take (§3.1, "Overall operation")."""
        return max(self.queue_ema_s or 0.0, self.min_budget_s)

    def configuration_set(self, group: str, tenant: str, workflow_id: str) -> int | None:
        """The workflow's configuration set now (a mask over its type's space); None when the
        policy does not know it (never seen, forgotten, or a type the group does not declare)."""
        workflow = self._workflows.get((group, tenant, workflow_id))
        return None if workflow is None or workflow.space is None else workflow.mask

    def routing_stats(self) -> dict[str, float]:
        """How the configuration searches went (§5.3, "Routing overheads"): workflows searched,
        their mean routing time and router calls, the fraction the budget cut short, and the
        fraction of first calls whose queueing outlasted their search (it hid the routing)."""
        return self._searches.summary()

    @property
    def tracked_workflows(self) -> int:
        """Workflows the policy keeps state for."""
        return len(self._workflows)

    def queued(self, request: QueuedRequest, now: float) -> None:
        group = self.groups.get(request.model)
        if group is None:
            raise ValueError(f"{request.request_id!r} names {request.model!r}, not a model group")
        self._tick(now)
        workflow = self._workflow_of(request, group, now)
        meta = request.app_metadata
        agent = None
        depth = 0
        if meta is not None and workflow.space is not None and workflow.space.position(meta.agent_id) is not None:
            agent = meta.agent_id
            parents = [workflow.agent_of[p] for p in meta.parent_request_ids if p in workflow.agent_of]
            self.graph.observe(workflow.space.workflow_type, agent, parents)
            workflow.agent_of[request.request_id] = agent
            depth = self.graph.depth(workflow.space.workflow_type, agent)
        call = _Call(request, workflow, agent, (workflow.rank, -depth, next(self._sequence)))
        self._calls[request.request_id] = call
        workflow.queued.add(request.request_id)
        workflow.last_active = now
        self._idle.pop(workflow.key, None)
        if workflow.released:
            self._queues[group.name].add(request.request_id, call.order, self._models(call))

    def unqueued(self, request_id: str) -> None:
        call = self._calls.pop(request_id, None)
        if call is None:
            return
        workflow = call.workflow
        self._queues[workflow.group.name].remove(request_id)
        workflow.queued.discard(request_id)
        if workflow.first_call == request_id:
            workflow.first_call = None  # it never waited to the end: no queue time to learn
        if not workflow.queued:
            self._went_idle(workflow, self._now)

    def assign(self, group: str, workers: Sequence[WorkerView], now: float) -> list[Assignment]:
        self._tick(now)
        queue = self._queues.get(group)
        if not queue:
            return []
        replicas = self._replicas(group, workers)
        if not replicas:
            return []
        walked: list[str] = []
        plan = beam_assign(self._stages(queue, {r.model for r in replicas}, walked), replicas, self.beam_width)
        assignments: list[Assignment] = []
        touched: dict[Hashable, _Workflow] = {}
        for placement in plan.placements:
            request_id = walked[placement.stage]
            assignments.append(Assignment(request_id, placement.worker_id))
            workflow = self._placed(request_id, placement.model, now)
            touched[workflow.key] = workflow
        for workflow in touched.values():
            assert workflow.mask == plan.masks.get(workflow.key, workflow.mask), "the beam's pruning differs"
            for request_id in workflow.queued:  # the set shrank: some may run on fewer models now
                if workflow.released:
                    queue.move(request_id, self._models(self._calls[request_id]))
            if not workflow.queued:
                self._went_idle(workflow, now)
        return assignments

    def wake_at(self, now: float) -> float | None:
        self._tick(now)
        while self._pending and self._is_stale(self._pending[0]):
            heapq.heappop(self._pending)
        return self._pending[0][0] if self._pending else None

    # ---- the workflows --------------------------------------------------------------------------

    def _workflow_of(self, request: QueuedRequest, group: ModelGroup, now: float) -> _Workflow:
        meta = request.app_metadata
        key: Hashable = request.request_id if meta is None else (group.name, request.tenant, meta.workflow_id)
        workflow = self._workflows.get(key)
        if workflow is not None:
            return workflow
        space = None if meta is None else group.space(meta.workflow_type_id)
        mask, ready_at, routing_s = 1, now, 0.0
        if space is not None:
            routed = self.strategy.configuration_set(group, space, request.input_text, self.budget_s())
            mask, routing_s = routed.mask, routed.routing_s
            ready_at = request.arrival_time + routing_s
            self._searches.searched(routing_s, routed.router_calls, routed.complete)
        released = ready_at <= now
        workflow = _Workflow(
            key, group, space, next(self._ranks), mask, ready_at, released, request.request_id, now, routing_s
        )
        self._workflows[key] = workflow
        if not released:
            heapq.heappush(self._pending, (ready_at, workflow.rank, key))
        return workflow

    def _placed(self, request_id: str, model: str, now: float) -> _Workflow:
        call = self._calls.pop(request_id)
        workflow = call.workflow
        self._queues[workflow.group.name].remove(request_id)
        workflow.queued.discard(request_id)
        workflow.last_active = now
        if call.agent is not None and workflow.space is not None:
            workflow.mask &= workflow.space.uses(call.agent, model)  # §3.2: prune after dispatch
            assert workflow.mask, f"{request_id} placed on {model!r}, outside its workflow's set"
        if workflow.first_call == request_id:
            waited = now - call.request.arrival_time
            ema = self.queue_ema_s
            self.queue_ema_s = waited if ema is None else ema + self.queue_ema_alpha * (waited - ema)
            if workflow.space is not None:
                self._searches.first_call(hidden=workflow.routing_s == 0 or waited > workflow.routing_s + _SLACK)
            workflow.first_call = None
        meta = call.request.app_metadata
        if meta is not None and meta.workflow_end:
            workflow.ended = True
        return workflow

    def _went_idle(self, workflow: _Workflow, now: float) -> None:
        if workflow.ended or not isinstance(workflow.key, tuple):
            self._forget(workflow)
        else:
            self._idle[workflow.key] = now
            self._idle.move_to_end(workflow.key)

    def _forget(self, workflow: _Workflow) -> None:
        self._workflows.pop(workflow.key, None)
        self._idle.pop(workflow.key, None)

    def _tick(self, now: float) -> None:
        """Release the workflows whose search has run; forget the ones idle past the TTL."""
        self._now = max(self._now, now)
        while self._pending and self._pending[0][0] <= now:
            entry = heapq.heappop(self._pending)
            if self._is_stale(entry):
                continue
            workflow = self._workflows[entry[2]]
            workflow.released = True
            queue = self._queues[workflow.group.name]
            for request_id in workflow.queued:
                call = self._calls[request_id]
                queue.add(request_id, call.order, self._models(call))
        while self._idle:
            key, since = next(iter(self._idle.items()))
            if since + self.workflow_idle_ttl_s > now:
                break
            self._forget(self._workflows[key])

    def _is_stale(self, entry: tuple[float, int, Hashable]) -> bool:
        workflow = self._workflows.get(entry[2])
        return workflow is None or workflow.rank != entry[1] or workflow.released

    # ---- a round --------------------------------------------------------------------------------

    def _options(self, call: _Call) -> tuple[StageOption, ...]:
        workflow = call.workflow
        if call.agent is None or workflow.space is None:
            return (StageOption(workflow.group.reference_model, -1),)
        space = workflow.space
        return tuple(StageOption(m, space.uses(call.agent, m)) for m in space.viable_models(workflow.mask, call.agent))

    def _models(self, call: _Call) -> frozenset[str]:
        return frozenset(option.model for option in self._options(call))

    def _stages(self, queue: MetaQueue, free_models: set[str], walked: list[str]) -> Iterator[Stage]:
        for request_id in queue.walk(free_models):
            call = self._calls[request_id]
            workflow = call.workflow
            walked.append(request_id)
            options = self._options(call)
            yield Stage(len(walked) - 1, workflow.key, workflow.mask, options, call.request.exclude_workers)

    def _replicas(self, group: str, workers: Sequence[WorkerView]) -> list[Replica]:
        members = self._members[group]
        replicas: list[Replica] = []
        for worker in workers:  # every worker at every assign: the cheap tests first
            if worker.placed >= (worker.admission_limit or worker.max_batch) or worker.draining:
                continue
            if worker.model not in members:
                continue
            profile = self.profiles.get(worker.model)
            saturation = worker.max_batch if profile is None else profile.saturation
            slots = min(saturation, worker.admission_limit or worker.max_batch) - worker.placed
            if slots <= 0:
                continue
            if profile is None:
                gains = (1.0,) * slots
            else:
                gains = tuple(profile.gain(worker.placed + k) for k in range(slots))
            replicas.append(Replica(worker.worker_id, worker.model, gains))
        return replicas

    def check_integrity(self) -> None:
        """Assert the bookkeeping invariants (tests call this after every step)."""
        for request_id, call in self._calls.items():
            workflow = call.workflow
            assert self._workflows.get(workflow.key) is workflow, f"{request_id}'s workflow was forgotten"
            assert request_id in workflow.queued
            in_queue = request_id in self._queues[workflow.group.name]
            assert in_queue == workflow.released, f"{request_id} in the meta-queue: {in_queue}"
        for workflow in self._workflows.values():
            assert workflow.mask, f"{workflow.key} has an empty configuration set"
            assert all(self._calls[r].workflow is workflow for r in workflow.queued)
            assert (workflow.key in self._idle) == (not workflow.queued), f"{workflow.key} idle bookkeeping"
        for queue in self._queues.values():
            queue.check_integrity()
        assert sum(len(q) for q in self._queues.values()) == sum(c.workflow.released for c in self._calls.values())

