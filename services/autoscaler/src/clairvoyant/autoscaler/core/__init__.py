"""The autoscaler's pure core: the replicas it owns (replicas.py) and what a tick sees (cluster.py).
The scaling policies themselves live in the policy package (``clairvoyant.policy.scaling``)."""

from clairvoyant.autoscaler.core.cluster import (
    ClusterView,
    ProfileDefaults,
    managed_models,
    model_profiles,
    scaling_input,
)
from clairvoyant.autoscaler.core.replicas import Observed, OwnedReplica, ReplicaBook, WorkerSeen

__all__ = [
    "ClusterView",
    "Observed",
    "OwnedReplica",
    "ProfileDefaults",
    "ReplicaBook",
    "WorkerSeen",
    "managed_models",
    "model_profiles",
    "scaling_input",
]
