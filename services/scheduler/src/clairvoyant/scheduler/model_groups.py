"""Model groups at start-up: the declaration (``CV_MODEL_GROUPS``), each workflow's configuration
router, and the scheduler policies of the preset, built with them.

A preset whose routing policy chooses models (``ASSIGNS_MODELS``, Aragog, seeds/002 §3) is created
with the declared groups (``groups=``), their replica profiles (``profiles=``) and, when its policy
takes them, the per-workflow baseline's fixed configurations (``fixed=``) or one router per (group,
workflow type) that names one (``routers=``): a ``table`` router from its JSON profile, a ``classifier`` router
from its saved bytes (§3.1's binary routers).
Any other preset runs as before, and refuses a declaration: its groups' calls would never be
placed.  Every problem is a ``ModelGroupError`` naming the file or the preset, raised before the
scheduler serves anything.
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from typing import NamedTuple

from clairvoyant.core.model_groups import (
    ModelGroupError,
    ModelGroups,
    ReplicaProfile,
    RouterSpec,
    load_model_groups,
)
from clairvoyant.policy import PRESETS, PRIORITY_POLICIES, ROUTING_POLICIES
from clairvoyant.policy.aragog.types import ConfigRouter, EngineProfile
from clairvoyant.policy.capabilities import Capability, capabilities_of
from clairvoyant.policy.scheduling import PriorityPolicy, RoutingPolicy

logger = logging.getLogger(__name__)

RouterKey = tuple[str, str]  # (group name, workflow_type_id)


class SchedulerPolicies(NamedTuple):
    """What the scheduler core runs, and the groups it was built with (for the Snapshot)."""

    priority: PriorityPolicy
    routing: RoutingPolicy
    groups: ModelGroups  # empty when none are declared


def build_scheduler_policies(preset: str, groups_path: Path | None = None) -> SchedulerPolicies:
    """Fresh policies of ``preset``; with ``groups_path``, the groups it declares are given to the
    routing policy, which must choose models.  Raises ModelGroupError (a bad file or router
    profile, or a preset that does not choose models) and ValueError (an unknown preset)."""
    groups = load_model_groups(groups_path) if groups_path is not None else ModelGroups()
    names = PRESETS.create(preset)
    priority = PRIORITY_POLICIES.create(names.priority)
    routing = ROUTING_POLICIES.create(names.routing)
    if Capability.ASSIGNS_MODELS not in capabilities_of(routing):
        if groups:
            raise ModelGroupError(
                f"the scheduler preset {preset!r} does not choose models, so the model groups of "
                f"{groups_path} ({', '.join(groups.groups)}) could never be served; use one of: "
                f"{', '.join(model_choosing_presets()) or 'none is registered'}"
            )
        return SchedulerPolicies(priority, routing, groups)
    routers = load_routers(groups)
    takes = inspect.signature(ROUTING_POLICIES.factory(names.routing)).parameters
    options: dict[str, object] = {"groups": groups, "profiles": engine_profiles(groups)}
    if "routers" in takes:
        options["routers"] = routers
    elif routers:
        logger.warning("the %s preset reads no configuration routers; the declared ones are unused", preset)
    if "fixed" in takes:
        options["fixed"] = fixed_configurations(groups)
    routing = ROUTING_POLICIES.create(names.routing, **options)
    return SchedulerPolicies(priority, routing, groups)


def engine_profiles(groups: ModelGroups) -> dict[str, EngineProfile]:
    """The declared replica profiles as the policy reads them; a model profiled without a curve
    gains 1 per slot.  Raises ModelGroupError when two groups profile one model differently."""
    profiles: dict[str, EngineProfile] = {}
    declared: dict[str, ReplicaProfile] = {}
    for group in groups.groups.values():
        for model, profile in group.profiles.items():
            if declared.setdefault(model, profile) != profile:
                raise ModelGroupError(f"model {model!r} is profiled differently in two groups")
            curve = profile.throughput or tuple(float(b) for b in range(1, profile.saturation + 1))
            profiles[model] = EngineProfile(model, profile.saturation, (0.0, *curve))
    return profiles


def fixed_configurations(groups: ModelGroups) -> dict[RouterKey, int]:
    """(group, workflow type) -> the per-workflow baseline's configuration, where declared."""
    return {
        (group.name, workflow_type): workflow.fixed
        for group in groups.groups.values()
        for workflow_type, workflow in group.workflows.items()
        if workflow.fixed is not None
    }


def model_choosing_presets() -> list[str]:
    """The presets whose routing policy chooses the model of a group's calls."""
    return [
        name
        for name in PRESETS
        if Capability.ASSIGNS_MODELS in capabilities_of(ROUTING_POLICIES.create(PRESETS.create(name).routing))
    ]


def load_routers(groups: ModelGroups) -> dict[RouterKey, ConfigRouter]:
    """One router per (group, workflow type) whose declaration names one.  A workflow without a
    router runs on its group's reference model (model_groups.py says why)."""
    routers: dict[RouterKey, ConfigRouter] = {}
    for group in groups.groups.values():
        for workflow_type, workflow in group.workflows.items():
            if workflow.router is not None:
                routers[(group.name, workflow_type)] = load_router(workflow.router)
    return routers


def load_router(spec: RouterSpec) -> ConfigRouter:
    """The router ``spec`` names.  Raises ModelGroupError when its profile cannot be read or used."""
    try:
        if spec.kind == "table":
            from clairvoyant.policy.aragog.routers import TableRouter

            return TableRouter.from_dict(json.loads(spec.path.read_text()))
        from clairvoyant.policy.aragog.classifier import ClassifierRouter

        return ClassifierRouter.loads(spec.path.read_bytes())
    except OSError as exc:
        raise ModelGroupError(f"cannot read the {spec.kind} router {spec.path}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise ModelGroupError(f"{spec.path}: not a usable {spec.kind} router profile: {exc}") from exc
