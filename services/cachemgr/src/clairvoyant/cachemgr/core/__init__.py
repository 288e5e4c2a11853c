"""The cache manager's pure core: the cluster KV index, the tenant-scoped workflow history, prompt
assembly from templates, and ``CacheManagerCore`` running a ``CachePolicy`` over them.  No I/O, no
clock reads, no protobuf: the service's adapters convert at the edge.
"""

from clairvoyant.cachemgr.core.history import HistoryCall, WorkflowHistory
from clairvoyant.cachemgr.core.index import ClusterIndex, batch_problem
from clairvoyant.cachemgr.core.manager import CacheManagerCore
from clairvoyant.cachemgr.core.speculation import SpeculationBook
from clairvoyant.cachemgr.core.values import CoreConfig, CoreStats, TierCount, call_problem

__all__ = [
    "CacheManagerCore",
    "ClusterIndex",
    "CoreConfig",
    "CoreStats",
    "HistoryCall",
    "SpeculationBook",
    "TierCount",
    "WorkflowHistory",
    "batch_problem",
    "call_problem",
]
