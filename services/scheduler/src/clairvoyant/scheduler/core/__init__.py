"""The scheduler's pure core: queues, placement accounting and policies.  No I/O, no clock reads.

The simulator imports this package directly.  Importing it registers every built-in policy.
"""

from clairvoyant.scheduler.core.global_queue import GlobalScheduler
from clairvoyant.scheduler.core.policies import (
    PRESETS,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerPreset,
    build_policies,
    eligible_workers,
)
from clairvoyant.scheduler.core.types import (
    Decision,
    ExpiredWorker,
    QueuedRequest,
    QueueState,
    SchedulerSnapshot,
    WorkerReport,
    WorkerView,
)

__all__ = [
    "PRESETS",
    "PRIORITY_POLICIES",
    "ROUTING_POLICIES",
    "Decision",
    "ExpiredWorker",
    "GlobalScheduler",
    "PriorityPolicy",
    "QueueState",
    "QueuedRequest",
    "RoutingPolicy",
    "SchedulerPreset",
    "SchedulerSnapshot",
    "WorkerReport",
    "WorkerView",
    "build_policies",
    "eligible_workers",
]
