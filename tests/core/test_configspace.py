"""Configuration spaces as bit masks, and the model-group declaration that names them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import ModelGroupError, load_model_groups, parse_model_groups

pytestmark = pytest.mark.unit

MODELS = ("m7", "m14", "m32")


def space(agents: int = 3) -> ConfigSpace:
    return ConfigSpace("wf", tuple(f"a{i}" for i in range(agents)), (MODELS,) * agents)


def test_numbering_round_trips_every_configuration() -> None:
    s = ConfigSpace("wf", ("a", "b", "c"), (("x", "y"), MODELS, ("p", "q", "r", "t")))
    assert s.size == 2 * 3 * 4
    seen = set()
    for levels in itertools.product(range(2), range(3), range(4)):
        config = s.config(levels)
        assert s.levels(config) == levels
        assert s.config_of(s.models(config)) == config
        seen.add(config)
    assert seen == set(range(s.size))
    assert s.models(s.reference) == {"a": "y", "b": "m32", "c": "t"}
    assert s.models(s.base) == {"a": "x", "b": "m7", "c": "p"}
    assert s.name(s.reference) == "y+m32+t"


def test_uses_masks_partition_the_space_per_agent() -> None:
    s = space()
    for agent in s.agents:
        masks = [s.uses(agent, m) for m in MODELS]
        assert sum(bin(m).count("1") for m in masks) == s.size
        assert masks[0] | masks[1] | masks[2] == s.everything
        assert masks[0] & masks[1] == 0
    for config in range(s.size):
        for agent, model in s.models(config).items():
            assert s.uses(agent, model) >> config & 1
    assert s.uses("a0", "nope") == 0 and s.uses("nope", "m7") == 0


def test_pruning_to_a_dispatched_model_keeps_exactly_the_configurations_that_use_it() -> None:
    s = space()
    mask = s.everything
    mask &= s.uses("a0", "m14")
    assert list(s.members(mask)) == [c for c in range(s.size) if s.models(c)["a0"] == "m14"]
    assert s.viable_models(mask, "a0") == ("m14",)
    assert s.viable_models(mask, "a1") == MODELS
    mask &= s.uses("a1", "m7") | s.uses("a1", "m32")
    assert s.viable_models(mask, "a1") == ("m7", "m32")
    assert s.viable_models(mask, "unknown") == ()


def test_upgrades_move_one_agent_one_option_up() -> None:
    s = space()
    assert sorted(s.upgrades(s.base)) == sorted(s.config(lv) for lv in [(1, 0, 0), (0, 1, 0), (0, 0, 1)])
    assert list(s.upgrades(s.reference)) == []
    for config in range(s.size):
        for up in s.upgrades(config):
            diff = [b - a for a, b in zip(s.levels(config), s.levels(up), strict=True)]
            assert sorted(diff) == [0, 0, 1]


def test_cost_sums_the_agents_models() -> None:
    s = space()
    cost = {"m7": 7.0, "m14": 14.0, "m32": 32.0}
    assert s.cost(s.base, cost) == 21.0
    assert s.cost(s.reference, cost) == 96.0


@pytest.mark.parametrize(
    ("agents", "options", "message"),
    [((), (), "no agents"), (("a", "a"), (MODELS, MODELS), "twice"), (("a",), ((),), "one or more")],
)
def test_bad_spaces_are_refused(agents: tuple[str, ...], options: tuple[tuple[str, ...], ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ConfigSpace("wf", agents, options)


def test_a_declaration_names_spaces_costs_and_routers(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(
        """
groups:
  qwen-auto:
    models: {m7: 7, m14: 14, m32: 32}
    workflows:
      self_refine:
        agents: [generate, critique, refine]
        router: {table: profiles/self_refine.json}
      sql:
        agents:
          keywords: [m32, m7]
          sql: all
"""
    )
    groups = load_model_groups(path)
    group = groups.get("qwen-auto")
    assert group is not None and "qwen-auto" in groups and groups.members() == {"qwen-auto": frozenset(MODELS)}
    assert group.models == MODELS and group.reference_model == "m32"
    refine = group.workflows["self_refine"]
    assert refine.space.size == 27
    assert refine.router is not None and refine.router.kind == "table"
    assert refine.router.path == tmp_path / "profiles" / "self_refine.json"
    sql = group.space("sql")
    assert sql is not None and sql.options == (("m7", "m32"), MODELS)  # the group's cost order
    assert group.workflows["sql"].router is None
    assert group.space("unknown") is None
    plain = parse_model_groups({"groups": {"g": {"models": ["a", "b"]}}})
    assert plain.groups["g"].model_cost == {"a": 1.0, "b": 2.0}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"groupz": {}}, "one key"),
        ({"groups": {"g": {"models": []}}}, "empty"),
        ({"groups": {"g": {"models": {"a": 2, "b": 1}}}}, "cheapest first"),
        ({"groups": {"g": {"models": {"a": -1}}}}, "positive"),
        ({"groups": {"g": {"models": ["a"], "workflows": {"w": {"agents": {"x": ["zz"]}}}}}}, "not in the group"),
        ({"groups": {"g": {"models": ["a"], "workflows": {"w": {"agents": []}}}}}, "'agents'"),
        ({"groups": {"g": {"models": ["a"], "workflows": {"w": {"agents": ["x"], "router": {"svm": "p"}}}}}}, "router"),
        ({"groups": {"g": {"models": ["a"], "extra": 1}}}, "expected keys"),
    ],
)
def test_bad_declarations_name_what_is_wrong(raw: object, message: str) -> None:
    with pytest.raises(ModelGroupError, match=message):
        parse_model_groups(raw)


def test_unreadable_or_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelGroupError, match="cannot read"):
        load_model_groups(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ModelGroupError, match="bad.json: not valid JSON"):
        load_model_groups(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"groups": {"g": {"models": ["a", "b"]}}}))
    assert load_model_groups(good).members() == {"g": frozenset({"a", "b"})}
    broken = tmp_path / "bad.yaml"
    broken.write_text("groups: [unclosed")
    with pytest.raises(ModelGroupError, match="not valid YAML"):
        load_model_groups(broken)
