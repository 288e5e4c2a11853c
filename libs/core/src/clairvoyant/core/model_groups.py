"""Model groups: a name an application sends as its ``model`` so that the cluster picks the served
model per call (Aragog, seeds/002).  The gateway checks names against them; the scheduler's
model-choosing presets read the configuration spaces.

The declaration, a YAML or JSON file (``CV_MODEL_GROUPS``)::

    groups:
      qwen2.5-auto:                      # what requests send as "model"
        models:                          # the served models, cheapest first, with a cost
          qwen2.5-7b: 7                  #   (parameters, in billions: FLOPs per token)
          qwen2.5-14b: 14
          qwen2.5-32b: 32                # the last one is the accuracy reference
        profiles:                        # optional, per served model: its replica's slots (the
          qwen2.5-7b:                    #   batch past which throughput stops improving) and
            saturation: 62               #   decode tokens/s with 1, 2, ... calls running
            throughput: [166, 322, 475]  #   (omitted: every slot gains the same)
        workflows:                       # configuration spaces, per workflow_type_id
          self_refine:
            agents: [generate, critique, refine]     # each agent may run on every model
            router: {table: profiles/self_refine.json}
          text_to_sql:
            agents:
              keywords: [qwen2.5-7b, qwen2.5-32b]    # or on some of them, cheapest first
              sql: all
            router: {classifier: profiles/text_to_sql.pkl}
            fixed: {keywords: qwen2.5-7b, sql: qwen2.5-32b}   # the per-workflow baseline's configuration

``models`` may also be a plain list (costs 1, 2, 3, ... in order).  A call of a workflow type or
an agent the group does not declare runs on the reference model; so does every call of a
workflow type without a router, whose accurate configurations nobody has profiled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from clairvoyant.core.configspace import ConfigSpace

# ScheduleRequest.input_text, a group call's input, is cut to this many characters: the
# configuration routers read the start of the input only (the gateway cuts, the scheduler again).
INPUT_TEXT_MAX_CHARS = 4096

RouterKind = Literal["table", "classifier"]
ROUTER_KINDS: tuple[RouterKind, ...] = ("table", "classifier")


class ModelGroupError(ValueError):
    """A model-group declaration that cannot be used; the message names where."""


@dataclass(frozen=True)
class RouterSpec:
    kind: RouterKind
    path: Path  # the profile the router loads (resolved against the declaration's directory)


@dataclass(frozen=True)
class GroupWorkflow:
    space: ConfigSpace
    router: RouterSpec | None = None
    fixed: int | None = None  # the one configuration of the per-workflow baseline (None: c*)


@dataclass(frozen=True)
class ReplicaProfile:
    """A served model's replica as profiled offline: ``saturation`` calls (its slots), and decode
    tokens/s with 1..n calls running (empty: not measured, every slot gains the same)."""

    saturation: int
    throughput: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelGroup:
    name: str
    model_cost: Mapping[str, float]  # served model -> cost, cheapest first (insertion order)
    workflows: Mapping[str, GroupWorkflow] = field(default_factory=dict)
    profiles: Mapping[str, ReplicaProfile] = field(default_factory=dict)  # served model -> profile

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.model_cost)

    @property
    def reference_model(self) -> str:
        return self.models[-1]

    def space(self, workflow_type: str) -> ConfigSpace | None:
        workflow = self.workflows.get(workflow_type)
        return None if workflow is None else workflow.space


@dataclass(frozen=True)
class ModelGroups:
    groups: Mapping[str, ModelGroup] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.groups

    def __bool__(self) -> bool:
        return bool(self.groups)

    def get(self, name: str) -> ModelGroup | None:
        return self.groups.get(name)

    def members(self) -> dict[str, frozenset[str]]:
        """Group name -> the served models its calls may run on."""
        return {name: frozenset(group.models) for name, group in self.groups.items()}


def parse_model_groups(raw: Any, base: Path | None = None, source: str = "model groups") -> ModelGroups:
    """Validate a declaration (the parsed file).  Raises ModelGroupError naming the bad entry.
    ``base``: the directory router paths are relative to."""
    if raw is None:
        return ModelGroups()
    if not isinstance(raw, dict) or set(raw) - {"groups"}:
        raise ModelGroupError(f"{source}: expected a mapping with one key, 'groups'")
    groups_raw = raw.get("groups") or {}
    if not isinstance(groups_raw, dict):
        raise ModelGroupError(f"{source}: 'groups' must map group names to their declarations")
    groups: dict[str, ModelGroup] = {}
    for name, body in groups_raw.items():
        where = f"{source}: group {name!r}"
        if not isinstance(body, dict) or set(body) - {"models", "workflows", "profiles"}:
            raise ModelGroupError(f"{where}: expected keys 'models', 'workflows' and 'profiles'")
        costs = _model_costs(body.get("models"), where)
        workflows: dict[str, GroupWorkflow] = {}
        for wtype, wbody in (body.get("workflows") or {}).items():
            workflows[str(wtype)] = _workflow(str(wtype), wbody, tuple(costs), base, f"{where}, workflow {wtype!r}")
        profiles = _profiles(body.get("profiles"), tuple(costs), where)
        groups[str(name)] = ModelGroup(str(name), costs, workflows, profiles)
    return ModelGroups(groups)


def load_model_groups(path: str | Path) -> ModelGroups:
    """Read a declaration file (``.json``, else YAML).  Raises ModelGroupError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ModelGroupError(f"cannot read model groups file {path}: {exc.strerror or exc}") from exc
    if path.suffix == ".json":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ModelGroupError(f"{path}: not valid JSON: {exc}") from exc
    else:
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ModelGroupError(f"{path}: not valid YAML: {exc}") from exc
    return parse_model_groups(raw, path.parent, str(path))


def _model_costs(raw: Any, where: str) -> dict[str, float]:
    if isinstance(raw, list):
        costs = {str(m): float(i + 1) for i, m in enumerate(raw)}
        if len(costs) != len(raw):
            raise ModelGroupError(f"{where}: 'models' names a model twice")
    elif isinstance(raw, dict):
        costs = {}
        for model, cost in raw.items():
            if isinstance(cost, bool) or not isinstance(cost, int | float) or cost <= 0:
                raise ModelGroupError(f"{where}: the cost of {model!r} must be a positive number")
            costs[str(model)] = float(cost)
    else:
        raise ModelGroupError(f"{where}: 'models' must list the served models, cheapest first")
    if not costs:
        raise ModelGroupError(f"{where}: 'models' is empty")
    ordered = list(costs.values())
    if ordered != sorted(ordered):
        raise ModelGroupError(f"{where}: 'models' must be ordered cheapest first (costs {ordered})")
    return costs


def _workflow(wtype: str, body: Any, models: tuple[str, ...], base: Path | None, where: str) -> GroupWorkflow:
    if not isinstance(body, dict) or set(body) - {"agents", "router", "fixed"}:
        raise ModelGroupError(f"{where}: expected keys 'agents', 'router' and 'fixed'")
    agents_raw = body.get("agents")
    if isinstance(agents_raw, list):
        agents_raw = {a: "all" for a in agents_raw}
    if not isinstance(agents_raw, dict) or not agents_raw:
        raise ModelGroupError(f"{where}: 'agents' must list the agents (or map each to its models)")
    agents, options = [], []
    for agent, opts in agents_raw.items():
        if opts == "all" or opts is None:
            chosen = models
        elif isinstance(opts, list) and opts:
            unknown = [m for m in opts if m not in models]
            if unknown:
                raise ModelGroupError(f"{where}: agent {agent!r} names models not in the group: {unknown}")
            chosen = tuple(m for m in models if m in opts)  # the group's cost order
        else:
            raise ModelGroupError(f"{where}: agent {agent!r} must map to 'all' or a list of the group's models")
        agents.append(str(agent))
        options.append(chosen)
    router = _router(body.get("router"), base, where)
    try:
        space = ConfigSpace(wtype, tuple(agents), tuple(options))
    except ValueError as exc:
        raise ModelGroupError(f"{where}: {exc}") from exc
    fixed = body.get("fixed")
    if fixed is not None:
        if not isinstance(fixed, dict) or set(fixed) != set(space.agents):
            raise ModelGroupError(f"{where}: 'fixed' must map every agent ({', '.join(space.agents)}) to a model")
        try:
            fixed = space.config_of({str(a): str(m) for a, m in fixed.items()})
        except ValueError as exc:
            raise ModelGroupError(f"{where}: 'fixed': {exc}") from exc
    return GroupWorkflow(space, router, fixed)


def _profiles(raw: Any, models: tuple[str, ...], where: str) -> dict[str, ReplicaProfile]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ModelGroupError(f"{where}: 'profiles' must map served models to their profiles")
    profiles: dict[str, ReplicaProfile] = {}
    for model, body in raw.items():
        at = f"{where}, profile of {model!r}"
        if model not in models:
            raise ModelGroupError(f"{at}: not a model of the group")
        if not isinstance(body, dict) or set(body) - {"saturation", "throughput"} or "saturation" not in body:
            raise ModelGroupError(f"{at}: expected 'saturation' and, optionally, 'throughput'")
        saturation, curve = body["saturation"], body.get("throughput") or []
        if isinstance(saturation, bool) or not isinstance(saturation, int) or saturation < 1:
            raise ModelGroupError(f"{at}: 'saturation' must be a whole number of calls, at least 1")
        numbers = isinstance(curve, list) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in curve)
        if not numbers or (curve and len(curve) != saturation) or any(x <= 0 for x in curve):
            raise ModelGroupError(f"{at}: 'throughput' must list {saturation} positive tokens/s, at 1..{saturation} calls")
        profiles[str(model)] = ReplicaProfile(saturation, tuple(float(x) for x in curve))
    return profiles


def _router(raw: Any, base: Path | None, where: str) -> RouterSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ROUTER_KINDS:
        raise ModelGroupError(f"{where}: 'router' must be {{table: PATH}} or {{classifier: PATH}}")
    kind, path = next(iter(raw.items()))
    resolved = Path(str(path))
    if base is not None and not resolved.is_absolute():
        resolved = base / resolved
    return RouterSpec(kind, resolved)
