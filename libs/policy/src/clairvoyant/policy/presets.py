"""A preset names one policy per family, and so one behaviour for the whole cluster.

The scheduler builds its priority and routing policies from it, each engine its local rule (the
priority policy's ``ENGINE_RULE``, when it declares one), the cache manager its cache policy and
the autoscaler its scaling policy; the simulator builds all of them from the same name.
docs/scheduling.md has the presets table, docs/cache-manager.md the cache policies.
"""

from __future__ import annotations

from typing import NamedTuple, cast

from clairvoyant.core.registry import Registry
from clairvoyant.policy.cache import CACHE_POLICIES, CachePolicy
from clairvoyant.policy.capabilities import Capability, capabilities_of
from clairvoyant.policy.scaling import SCALING_POLICIES, ScalingPolicy
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    EngineRanked,
    LocalRule,
    PriorityPolicy,
    RoutingPolicy,
)


class Preset(NamedTuple):
    """One registered name per family."""

    priority: str  # a name in PRIORITY_POLICIES
    routing: str  # a name in ROUTING_POLICIES
    cache: str = "lru"  # a name in CACHE_POLICIES
    scaling: str = "static"  # a name in SCALING_POLICIES


class PresetRegistry(Registry[Preset]):
    """Presets by name; registering one checks that each family has the policy it names."""

    def register_preset(self, name: str, preset: Preset) -> Preset:
        for registry, choice in (
            (PRIORITY_POLICIES, preset.priority),
            (ROUTING_POLICIES, preset.routing),
            (CACHE_POLICIES, preset.cache),
            (SCALING_POLICIES, preset.scaling),
        ):
            if choice not in registry:
                raise ValueError(f"preset {name!r} names an unknown {registry.kind} {choice!r}")
        self.register(name)(lambda: preset)
        return preset


PRESETS = PresetRegistry("preset")


def build_policies(preset: str) -> tuple[PriorityPolicy, RoutingPolicy]:
    """Fresh scheduler policies of a preset.  Raises ValueError for an unknown name."""
    names = PRESETS.create(preset)
    return PRIORITY_POLICIES.create(names.priority), ROUTING_POLICIES.create(names.routing)


def engine_rule_of(priority: PriorityPolicy) -> LocalRule | None:
    """A fresh engine rule from ``priority`` when it declares ``ENGINE_RULE``; None otherwise."""
    if Capability.ENGINE_RULE not in capabilities_of(priority):
        return None
    return cast(EngineRanked, priority).engine_rule()


def build_engine_rule(preset: str) -> LocalRule | None:
    """A fresh engine rule of ``preset`` (one per engine); None when it has none.  Raises
    ValueError for an unknown name."""
    return engine_rule_of(PRIORITY_POLICIES.create(PRESETS.create(preset).priority))


def build_cache_policy(preset: str) -> CachePolicy:
    return CACHE_POLICIES.create(PRESETS.create(preset).cache)


def build_scaling_policy(preset: str) -> ScalingPolicy:
    return SCALING_POLICIES.create(PRESETS.create(preset).scaling)


PRESETS.register_preset("fcfs-rr", Preset("fcfs", "round-robin"))
PRESETS.register_preset("least-loaded", Preset("fcfs", "least-loaded"))
