"""The scheduler's pure core: queues, placement accounting and policies.  No I/O, no clock reads.

The simulator imports this package directly.  Importing it registers every built-in policy.
"""

from clairvoyant.scheduler.core import baselines as baselines  # registers the industry baseline presets
from clairvoyant.scheduler.core import clairvoyant as clairvoyant  # registers the clairvoyant preset
from clairvoyant.scheduler.core import kairos as kairos  # registers the kairos preset
from clairvoyant.scheduler.core import pythia as pythia  # registers the pythia preset
from clairvoyant.scheduler.core import saga as saga  # registers the saga preset
from clairvoyant.scheduler.core import topo as topo  # registers the topo-depth preset
from clairvoyant.scheduler.core.autellix import KQueueConfig, KQueuePriority, KQueueRule
from clairvoyant.scheduler.core.global_queue import GlobalScheduler
from clairvoyant.scheduler.core.leases import Lease, LeaseBook, Reclaimed
from clairvoyant.scheduler.core.policies import (
    PRESETS,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    EngineQueued,
    EngineRanked,
    LocalRule,
    PriorityPolicy,
    ProgramAware,
    RoutingPolicy,
    SchedulerPreset,
    build_policies,
    eligible_workers,
)
from clairvoyant.scheduler.core.process_table import ProcessTable, Program, ProgramKey
from clairvoyant.scheduler.core.types import (
    Completion,
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
    "Completion",
    "Decision",
    "EngineQueued",
    "EngineRanked",
    "ExpiredWorker",
    "GlobalScheduler",
    "KQueueConfig",
    "KQueuePriority",
    "KQueueRule",
    "Lease",
    "LeaseBook",
    "LocalRule",
    "PriorityPolicy",
    "ProcessTable",
    "Program",
    "ProgramAware",
    "ProgramKey",
    "QueueState",
    "QueuedRequest",
    "Reclaimed",
    "RoutingPolicy",
    "SchedulerPreset",
    "SchedulerSnapshot",
    "WorkerReport",
    "WorkerView",
    "build_policies",
    "eligible_workers",
]
