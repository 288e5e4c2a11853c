"""The policy families, their registries and the presets: pure, shared by every service and the
simulator.  Importing this package registers every built-in policy and preset.

    priority / routing (scheduling.py) · engine rule (LocalRule) · cache (cache.py, cache_*.py) · scaling (scaling.py)
    a policy's optional hooks: capabilities.py · presets: presets.py
"""

# the cache policies register first: the presets below name them
from clairvoyant.policy import cache_baselines as cache_baselines  # registers lmcache, hicache
from clairvoyant.policy import cache_continuum as cache_continuum  # registers continuum
from clairvoyant.policy import cache_kvflow as cache_kvflow  # registers kvflow
from clairvoyant.policy import cache_pythia as cache_pythia  # registers pythia (cache)
from clairvoyant.policy import cache_saga as cache_saga  # registers saga (cache)

# isort: split
from clairvoyant.policy import aragog as aragog  # registers the aragog presets (and per-input, per-workflow)
from clairvoyant.policy import autellix as autellix  # registers the autellix, plas, atlas, mlfq presets
from clairvoyant.policy import baselines as baselines  # registers the industry baseline presets
from clairvoyant.policy import clairvoyant as clairvoyant  # registers the clairvoyant preset
from clairvoyant.policy import kairos as kairos  # registers the kairos preset
from clairvoyant.policy import pythia as pythia  # registers the pythia preset
from clairvoyant.policy import pythia_scaling as pythia_scaling  # registers the pythia scaling policy
from clairvoyant.policy import saga as saga  # registers the saga preset
from clairvoyant.policy import scaling_baselines as scaling_baselines  # registers reactive, predictive
from clairvoyant.policy import thunderagent as thunderagent  # registers the thunderagent preset
from clairvoyant.policy import topo as topo  # registers the topo-depth preset
from clairvoyant.policy.cache import CACHE_POLICIES, BlockUse, CacheDirective, CachePolicy
from clairvoyant.policy.capabilities import Capability, PolicyRegistry, capabilities_of
from clairvoyant.policy.presets import (
    PRESETS,
    Preset,
    build_cache_policy,
    build_engine_rule,
    build_policies,
    build_scaling_policy,
    engine_rule_of,
)
from clairvoyant.policy.scaling import (
    SCALING_POLICIES,
    ActiveCall,
    ModelProfile,
    ModelTraffic,
    ReplicaPhase,
    ReplicaState,
    ScalingActions,
    ScalingDecision,
    ScalingInput,
    ScalingPolicy,
    plan_actions,
)
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    LocalRule,
    PriorityPolicy,
    RoutingPolicy,
    SchedulerView,
    eligible_workers,
)

__all__ = [
    "ActiveCall",
    "CACHE_POLICIES",
    "PRESETS",
    "PRIORITY_POLICIES",
    "ROUTING_POLICIES",
    "SCALING_POLICIES",
    "BlockUse",
    "CacheDirective",
    "CachePolicy",
    "Capability",
    "LocalRule",
    "PolicyRegistry",
    "Preset",
    "PriorityPolicy",
    "RoutingPolicy",
    "ModelProfile",
    "ModelTraffic",
    "ReplicaPhase",
    "ReplicaState",
    "ScalingActions",
    "ScalingDecision",
    "ScalingInput",
    "ScalingPolicy",
    "SchedulerView",
    "build_cache_policy",
    "build_engine_rule",
    "build_policies",
    "build_scaling_policy",
    "capabilities_of",
    "eligible_workers",
    "engine_rule_of",
    "plan_actions",
]
