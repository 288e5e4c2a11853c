"""The scheduler's pure core: global queues, placement accounting and leases.  No I/O, no clock reads.

The policies it runs, their value types and the presets live in ``clairvoyant.policy`` (shared with
the worker and the simulator); the names below are re-exported for the scheduler's callers.
"""

from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy import PRESETS, PRIORITY_POLICIES, ROUTING_POLICIES, build_policies, eligible_workers
from clairvoyant.policy.autellix import KQueueConfig, KQueuePriority, KQueueRule
from clairvoyant.policy.kv_index import KvApplied, KvIndex, TierWeights
from clairvoyant.policy.process_table import ProcessTable, Program, ProgramKey
from clairvoyant.policy.scheduling import LocalRule, PriorityPolicy, RoutingPolicy
from clairvoyant.policy.types import (
    Completion,
    Decision,
    ExpiredWorker,
    QueuedRequest,
    QueueState,
    SchedulerSnapshot,
    WorkerReport,
    WorkerView,
)
from clairvoyant.scheduler.core.global_queue import GlobalScheduler
from clairvoyant.scheduler.core.inspection import HeldCall
from clairvoyant.scheduler.core.leases import Lease, LeaseBook, Reclaimed

__all__ = [
    "PRESETS",
    "PRIORITY_POLICIES",
    "ROUTING_POLICIES",
    "Completion",
    "Decision",
    "ExpiredWorker",
    "GlobalScheduler",
    "HeldCall",
    "KQueueConfig",
    "KQueuePriority",
    "KQueueRule",
    "KvApplied",
    "KvBatch",
    "KvBlockEvent",
    "KvEventKind",
    "KvIndex",
    "KvTier",
    "Lease",
    "LeaseBook",
    "LocalRule",
    "PriorityPolicy",
    "ProcessTable",
    "Program",
    "ProgramKey",
    "QueueState",
    "QueuedRequest",
    "Reclaimed",
    "RoutingPolicy",
    "SchedulerSnapshot",
    "TierWeights",
    "WorkerReport",
    "WorkerView",
    "build_policies",
    "eligible_workers",
]
