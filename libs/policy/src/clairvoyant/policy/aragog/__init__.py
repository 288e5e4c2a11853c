"""Aragog (seeds/002): per-workflow configuration sets (§3.1) and a stage-wise scheduler that picks
each call's model among them by the engines' load (§3.2).  Importing this package registers the
routing policies and presets ``aragog``, ``aragog-per-input`` and ``aragog-per-workflow``.

    types.py (router contract, engine profiles) · pruning.py (the router search) · strategies.py
    (where a workflow's set comes from) · beam.py (one scheduling round) · metaqueue.py · graph.py
    (agent depths) · scheduler.py (the runtime scheduler) · policy.py (the routing policies and
    presets)
"""

from clairvoyant.policy.aragog.beam import (
    Placement,
    Replica,
    RoundPlan,
    Stage,
    StageOption,
    beam_assign,
    exhaustive_assign,
    greedy_assign,
)
from clairvoyant.policy.aragog.graph import AgentGraph
from clairvoyant.policy.aragog.metaqueue import MetaQueue
from clairvoyant.policy.aragog.policy import (
    AragogRouting,
    PerInputRouting,
    PerWorkflowRouting,
)
from clairvoyant.policy.aragog.scheduler import StageScheduler
from clairvoyant.policy.aragog.strategies import (
    AragogSearch,
    ConfigSetStrategy,
    PerInputChoice,
    PerWorkflowChoice,
    RoutedSet,
)
from clairvoyant.policy.aragog.types import ConfigRouter, EngineProfile

__all__ = [
    "AgentGraph",
    "AragogRouting",
    "AragogSearch",
    "ConfigRouter",
    "ConfigSetStrategy",
    "EngineProfile",
    "MetaQueue",
    "PerInputChoice",
    "PerInputRouting",
    "PerWorkflowChoice",
    "PerWorkflowRouting",
    "Placement",
    "Replica",
    "RoundPlan",
    "RoutedSet",
    "Stage",
    "StageOption",
    "StageScheduler",
    "beam_assign",
    "exhaustive_assign",
    "greedy_assign",
]
