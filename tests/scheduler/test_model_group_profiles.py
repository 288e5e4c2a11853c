"""A declaration's replica profiles and per-workflow configurations reach the Aragog presets."""

from __future__ import annotations

from pathlib import Path

import pytest

from clairvoyant.core.model_groups import ModelGroupError, ReplicaProfile, parse_model_groups
from clairvoyant.policy.aragog import AragogRouting, PerWorkflowChoice
from clairvoyant.policy.aragog.types import EngineProfile
from clairvoyant.scheduler.model_groups import build_scheduler_policies, engine_profiles

pytestmark = pytest.mark.unit

DECLARATION = """
groups:
  auto:
    models: {m-small: 7, m-large: 32}
    profiles:
      m-small: {saturation: 3, throughput: [100, 180, 240]}
      m-large: {saturation: 2}
    workflows:
      self_refine:
        agents: [generate, refine]
        fixed: {generate: m-small, refine: m-large}
"""


def declared(tmp_path: Path) -> Path:
    path = tmp_path / "groups.yaml"
    path.write_text(DECLARATION)
    return path


def test_profiles_become_the_policys_throughput_curves(tmp_path: Path) -> None:
    policies = build_scheduler_policies("aragog", declared(tmp_path))
    assert isinstance(policies.routing, AragogRouting)
    assert policies.routing.profiles == {
        "m-small": EngineProfile("m-small", 3, (0.0, 100.0, 180.0, 240.0)),
        "m-large": EngineProfile("m-large", 2, (0.0, 1.0, 2.0)),  # no curve: each slot gains the same
    }
    small = policies.routing.profiles["m-small"]
    assert [small.gain(b) for b in range(4)] == [100.0, 80.0, 60.0, 0.0]


def test_the_per_workflow_preset_runs_the_declared_configuration(tmp_path: Path) -> None:
    policies = build_scheduler_policies("aragog-per-workflow", declared(tmp_path))
    strategy = policies.routing.strategy  # type: ignore[attr-defined]
    assert isinstance(strategy, PerWorkflowChoice)
    space = policies.groups.groups["auto"].workflows["self_refine"].space
    assert space.models(strategy.fixed[("auto", "self_refine")]) == {"generate": "m-small", "refine": "m-large"}


def test_one_model_profiled_two_ways_is_refused() -> None:
    groups = parse_model_groups(
        {
            "groups": {
                "a": {"models": ["m"], "profiles": {"m": {"saturation": 2}}},
                "b": {"models": ["m"], "profiles": {"m": {"saturation": 3}}},
            }
        }
    )
    assert groups.groups["a"].profiles == {"m": ReplicaProfile(2)}
    with pytest.raises(ModelGroupError, match="profiled differently"):
        engine_profiles(groups)


@pytest.mark.parametrize(
    ("profiles", "message"),
    [
        ({"other": {"saturation": 2}}, "not a model of the group"),
        ({"m": {"throughput": [1.0]}}, "expected 'saturation'"),
        ({"m": {"saturation": 0}}, "at least 1"),
        ({"m": {"saturation": 2, "throughput": [1.0]}}, "must list 2 positive"),
        ({"m": {"saturation": 2, "throughput": [1.0, -2.0]}}, "must list 2 positive"),
    ],
)
def test_bad_profiles_are_named(profiles: dict[str, object], message: str) -> None:
    with pytest.raises(ModelGroupError, match=message):
        parse_model_groups({"groups": {"g": {"models": ["m"], "profiles": profiles}}})


@pytest.mark.parametrize(
    ("fixed", "message"),
    [({"a": "m"}, "every agent"), ({"a": "m", "b": "zz"}, "cannot run on 'zz'")],
)
def test_bad_fixed_configurations_are_named(fixed: dict[str, str], message: str) -> None:
    with pytest.raises(ModelGroupError, match=message):
        parse_model_groups({"groups": {"g": {"models": ["m"], "workflows": {"w": {"agents": ["a", "b"], "fixed": fixed}}}}})
