"""The workflow spec: validation messages, distributions, prompt composition and flow semantics."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clairvoyant.bench.workloads import SpecError, SpecWorkload, get_workload, load_spec
from clairvoyant.workloads.distributions import Constant, Empirical, Geometric, LogNormal, Uniform

pytestmark = pytest.mark.unit


def tiny_spec() -> dict[str, Any]:
    """A valid spec touching every step kind; tests break one thing at a time."""
    return {
        "name": "tiny",
        "models": {"big": "llama-3.1-70b", "small": "llama-3.1-8b"},
        "agents": {
            "planner": {
                "model": "big",
                "system_tokens": 100,
                "prompt": {"new": 50},
                "output": {"mean": 40, "cv": 0.2},
            },
            "engineer": {
                "model": "small",
                "alternatives": ["big"],
                "system_tokens": 200,
                "prompt": {"inputs": [{"agent": "planner"}], "new": {"mean": 30, "cv": 0.5}},
                "output": {"mean": 300, "cv": 0.4, "max": 2000},
                "tools": [{"name": "executor", "p": 0.5, "latency_s": {"mean": 2.0, "cv": 1.0}}],
            },
            "reviewer": {
                "model": "big",
                "system_tokens": 100,
                "prompt": {"inputs": [{"agent": "engineer", "select": "deps"}]},
                "output": {"dist": "uniform", "low": 50, "high": 150},
            },
        },
        "flow": [
            {"agent": "planner"},
            {
                "fanout": [
                    {"loop": [{"agent": "engineer"}], "count": {"dist": "empirical", "values": [1, 2]}}
                ],
                "count": 3,
            },
            {"agent": "reviewer"},
            {"choose": [{"p": 0.5, "do": [{"agent": "engineer"}]}, {"p": 0.5, "do": []}]},
            {"parallel": [[{"agent": "reviewer"}], [{"agent": "planner"}]]},
        ],
    }


def test_a_valid_spec_loads_from_a_mapping_yaml_and_json(tmp_path: Path) -> None:
    spec = load_spec(tiny_spec())
    assert spec.name == "tiny" and set(spec.agents) == {"planner", "engineer", "reviewer"}
    (tmp_path / "tiny.json").write_text(json.dumps(tiny_spec()))
    assert load_spec(tmp_path / "tiny.json") == spec
    import yaml

    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_spec()))
    assert load_spec(str(tmp_path / "tiny.yaml")) == spec
    # A user's file works wherever a built-in name does.
    workload = get_workload(str(tmp_path / "tiny.yaml"))
    assert workload.name == "tiny" and workload.stats().calls_per_workflow == pytest.approx(
        1 + 3 * 1.5 + 1 + 0.5 + 2
    )


def broken(change: Any) -> dict[str, Any]:
    spec = copy.deepcopy(tiny_spec())
    change(spec)
    return spec


def _set(path: list[Any], value: Any) -> Any:
    def change(spec: dict[str, Any]) -> None:
        node = spec
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _delete(path: list[Any]) -> Any:
    def change(spec: dict[str, Any]) -> None:
        node = spec
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


BAD_SPECS = [
    # (what is wrong, how, the path and message the error must show)
    (
        "negative cv",
        _set(["agents", "engineer", "output", "cv"], -0.1),
        "agents.engineer.output.cv: must be >= 0",
    ),
    (
        "unknown agent in the flow",
        _set(["flow", 2, "agent"], "reviwer"),
        "flow[2].agent: unknown agent 'reviwer'",
    ),
    (
        "unknown agent in a nested transition",
        _set(["flow", 3, "choose", 0, "do", 0, "agent"], "enginer"),
        "flow[3].choose[0].do[0].agent: unknown agent 'enginer'",
    ),
    (
        "unknown agent in a prompt input",
        _set(["agents", "reviewer", "prompt", "inputs", 0, "agent"], "coder"),
        "agents.reviewer.prompt.inputs[0].agent: unknown agent 'coder'",
    ),
    (
        "unknown model alias",
        _set(["agents", "planner", "model"], "gpt5"),
        "agents.planner.model: unknown model 'gpt5'",
    ),
    ("missing output", _delete(["agents", "planner", "output"]), "agents.planner.output: is required"),
    ("misspelt field", _set(["agents", "planner", "outptu"], 3), "agents.planner.outptu: unknown field"),
    (
        "unknown distribution",
        _set(["agents", "planner", "output"], {"dist": "weibull", "mean": 3}),
        "agents.planner.output.dist: unknown distribution 'weibull'",
    ),
    (
        "transition probabilities not summing to 1",
        _set(["flow", 3, "choose", 0, "p"], 0.4),
        "flow[3].choose: probabilities sum to 0.9, must sum to 1",
    ),
    (
        "unbounded loop",
        _set(["flow", 1, "fanout", 0, "count"], {"mean": 3, "cv": 1}),
        "flow[1].fanout[0].count.max: a loop count needs a finite bound",
    ),
    (
        "fan-out of zero",
        _set(["flow", 1, "count"], {"dist": "uniform", "low": 0, "high": 3}),
        "flow[1].count: a fan-out count must be >= 1",
    ),
    (
        "step of two kinds",
        _set(["flow", 0], {"agent": "planner", "loop": []}),
        "flow[0]: a step needs exactly one of",
    ),
    (
        "uniform bounds reversed",
        _set(["agents", "reviewer", "output", "low"], 500),
        "agents.reviewer.output: low (500) must be <= high (150)",
    ),
    (
        "unreachable mean within bounds",
        _set(["agents", "engineer", "output"], {"mean": 300, "cv": 0.4, "max": 200}),
        "agents.engineer.output: mean 300 must lie strictly between min and max",
    ),
    (
        "tools over probability 1",
        _set(["agents", "engineer", "tools", 0, "p"], 1.5),
        "agents.engineer.tools[0].p: must be <= 1",
    ),
    (
        "unused agent",
        _set(["agents", "ghost"], {"model": "big", "output": 5}),
        "agents.ghost: defined but never used in flow",
    ),
    (
        "bad select",
        _set(["agents", "reviewer", "prompt", "inputs", 0, "select"], "first"),
        "agents.reviewer.prompt.inputs[0].select: must be",
    ),
    ("empty flow", _set(["flow"], []), "flow: must have at least 1 item(s)"),
    (
        "too many calls",
        _set(["flow", 1, "count"], {"dist": "uniform", "low": 1, "high": 100000}),
        "flow: up to 200005 calls per workflow; the limit is 100000",
    ),
]


@pytest.mark.parametrize(("what", "change", "expected"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_the_validator_names_the_offending_field(what: str, change: Any, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(broken(change))
    assert expected in str(caught.value), f"{what}: {caught.value}"
    assert any(expected.startswith(f"{path}: ") for path, _ in caught.value.problems)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read .*missing.yaml"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"(?s)bad\.yaml.*not valid YAML"):
        load_spec(bad)
    bad.write_text("- just a list\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_spec(bad)


@pytest.mark.parametrize(
    "dist",
    [
        LogNormal(mean=300, cv=0.4),
        LogNormal(mean=300, cv=0.25, min=100, max=500),
        LogNormal(mean=37, cv=0.9, min=3, max=150),
        LogNormal(mean=6.66, cv=1.3, min=1, max=80),
        Uniform(low=100, high=500),
        Constant(value=7),
        Empirical(values=[1, 3, 4]),
        Geometric(p_continue=0.4, min=1, max=4),
    ],
    ids=lambda d: f"{d.dist}",
)
def test_distributions_realise_their_configured_moments(dist: Any) -> None:
    """Bounds do not shift a log-normal's mean or CV: they are solved for the truncated distribution."""
    rng = np.random.default_rng(7)
    draws = np.array([dist.sample_int(rng) for _ in range(20_000)], dtype=float)
    mean, cv = dist.moments()
    low, high = dist.support()
    assert draws.mean() == pytest.approx(mean, rel=0.02)
    assert draws.std() / draws.mean() == pytest.approx(cv, rel=0.05, abs=0.02)
    assert low - 1 < draws.min() and draws.max() <= np.ceil(high)


def test_geometric_counts_stop_at_the_bound() -> None:
    dist = Geometric(p_continue=0.4, min=1, max=4)
    pmf = dist._pmf()
    assert pmf == pytest.approx([0.6, 0.24, 0.096, 0.064])
    assert dist.moments()[0] == pytest.approx(1 + 0.4 + 0.16 + 0.064)


def _program(spec: dict[str, Any], seed: int = 0) -> Any:
    program = SpecWorkload(load_spec(spec)).instantiate(np.random.default_rng(seed), "w")
    program.check_integrity()
    return program


def test_fanout_and_join_dependencies() -> None:
    program = _program(tiny_spec())
    agents = [c.agent_id for c in program.calls]
    planner, reviewer = program.calls[0], program.calls[agents.index("reviewer")]
    engineers = [c for c in program.calls[: reviewer.index] if c.agent_id == "engineer"]
    branch_starts = [c for c in engineers if c.dependencies == (planner.call_id,)]
    assert len(branch_starts) == 3  # the fan-out: three branches off the planner
    # The join: the reviewer waits for the last engineer of each branch.
    assert len(reviewer.dependencies) == 3
    assert all(program.call(d).agent_id == "engineer" for d in reviewer.dependencies)
    # select: deps reads exactly the joined responses.
    refs = [seg.call_id for seg in reviewer.prompt if seg.kind == "call"]
    assert refs == list(reviewer.dependencies)
    # The parallel block at the end starts both branches from the same frontier, so nothing follows.
    last_two = program.calls[-2:]
    assert {c.agent_id for c in last_two} == {"reviewer", "planner"}
    assert last_two[0].dependencies == last_two[1].dependencies


def test_keep_context_continues_the_conversation_and_skips_what_it_already_holds() -> None:
    spec = {
        "name": "chat",
        "models": {"m": "llama-3.1-8b"},
        "agents": {
            "user_proxy": {"model": "m", "system_tokens": 10, "prompt": {"new": 20}, "output": 30},
            "assistant": {
                "model": "m",
                "system_tokens": 100,
                "prompt": {
                    "keep_context": True,
                    "inputs": [{"agent": "user_proxy", "part": "response", "max_tokens": 25}],
                    "first_new": 40,
                    "new": 7,
                },
                "output": 50,
            },
        },
        "flow": [{"agent": "user_proxy"}, {"loop": [{"agent": "assistant"}], "count": 3}],
    }
    calls = _program(spec).calls
    proxy, first, second, third = calls
    assert [tuple(s) for s in first.prompt] == [
        ("system", "assistant", 100),
        ("call", proxy.call_id, "response", 25),
        ("new", 40),
    ]
    # The second turn holds the first turn's prompt (which already holds the proxy's reply) + reply.
    assert [tuple(s) for s in second.prompt] == [
        ("call", first.call_id, "prompt", 165),
        ("call", first.call_id, "response", 50),
        ("new", 7),
    ]
    assert third.prompt_tokens == second.prompt_tokens + 50 + 7


def test_chain_context_restarts_in_each_fanout_branch() -> None:
    spec = {
        "name": "research",
        "models": {"m": "llama-3.1-8b"},
        "agents": {
            "lead": {"model": "m", "system_tokens": 10, "output": 20},
            "worker": {
                "model": "m",
                "system_tokens": 30,
                "prompt": {"keep_context": "chain", "new": 5},
                "output": 9,
            },
        },
        "flow": [
            {
                "loop": [
                    {"agent": "lead"},
                    {"fanout": [{"loop": [{"agent": "worker"}], "count": 2}], "count": 2},
                ],
                "count": 2,
            }
        ],
    }
    program = _program(spec)
    workers = [c for c in program.calls if c.agent_id == "worker"]
    assert len(workers) == 2 * 2 * 2
    for call in workers:
        after_lead = program.call(call.dependencies[0]).agent_id == "lead"
        # A branch's first worker starts afresh (even in the second turn, where earlier workers are
        # ancestors); its second continues the first.
        assert (call.prompt[0].kind == "system") == after_lead
        if not after_lead:
            assert call.prompt[0] == (
                "call",
                call.dependencies[0],
                "prompt",
                program.call(call.dependencies[0]).prompt_tokens,
            )


def test_output_correlation_between_consecutive_calls() -> None:
    spec = {
        "name": "corr",
        "models": {"m": "llama-3.1-8b"},
        "agents": {"a": {"model": "m", "output": {"mean": 1000, "cv": 0.5}, "output_correlation": 0.8}},
        "flow": [{"loop": [{"agent": "a"}], "count": 2}],
    }
    workload = SpecWorkload(load_spec(spec))
    rng = np.random.default_rng(3)
    pairs = np.array(
        [[c.output_tokens for c in workload.instantiate(rng, f"w{i}").calls] for i in range(3000)]
    )
    logs = np.log(pairs)
    assert np.corrcoef(logs[:, 0], logs[:, 1])[0, 1] == pytest.approx(0.8, abs=0.05)
    assert pairs.mean() == pytest.approx(1000, rel=0.03)  # the marginal is untouched


def test_choose_picks_branches_with_their_probabilities() -> None:
    spec = tiny_spec()
    spec["flow"] = [
        {"choose": [{"p": 0.2, "do": [{"agent": "planner"}]}, {"p": 0.8, "do": [{"agent": "reviewer"}]}]}
    ]
    spec["agents"]["engineer"]["prompt"]["inputs"] = []
    spec["flow"].append({"agent": "engineer"})
    workload = SpecWorkload(load_spec(spec))
    rng = np.random.default_rng(5)
    firsts = [workload.instantiate(rng, f"w{i}").calls[0].agent_id for i in range(4000)]
    assert firsts.count("planner") / len(firsts) == pytest.approx(0.2, abs=0.02)


def test_models_can_be_remapped_for_a_small_cluster() -> None:
    workload = SpecWorkload(load_spec(tiny_spec()))
    one = workload.with_models("smollm2-135m-instruct")
    program = one.instantiate(np.random.default_rng(0), "w")
    assert {c.model for c in program.calls} == {"smollm2-135m-instruct"}
    assert all(
        c.alternative_models == ("smollm2-135m-instruct",) for c in program.calls if c.agent_id == "engineer"
    )
    partial = workload.with_models({"small": "qwen2.5-7b"})
    assert partial.served_models() == ["llama-3.1-70b", "qwen2.5-7b"]
    with pytest.raises(ValueError, match="unknown model aliases"):
        workload.with_models({"huge": "x"})


def test_the_documented_example_is_a_valid_spec() -> None:
    import re

    import yaml

    from clairvoyant.workloads.data import repo_root

    text = (repo_root() / "docs" / "workloads.md").read_text()
    example = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert example is not None
    workload = SpecWorkload(load_spec(yaml.safe_load(example.group(1))))
    program = workload.instantiate(np.random.default_rng(0), "doc")
    program.check_integrity()
    assert workload.name == "review_loop" and program.calls[0].agent_id == "planner"


def test_check_integrity_rejects_broken_programs() -> None:
    from dataclasses import replace

    from clairvoyant.bench.workloads import ProgramError, WorkflowProgram
    from clairvoyant.workloads.program import CallSegment

    program = _program(tiny_spec())
    calls = list(program.calls)
    # A segment pointing at a call that is not an ancestor (a sibling branch).
    reviewer = next(c for c in calls if c.agent_id == "reviewer")
    stranger = calls[-1]
    bad = replace(
        reviewer,
        prompt=(*reviewer.prompt, CallSegment("call", stranger.call_id, "response", 1)),
        prompt_tokens=reviewer.prompt_tokens + 1,
    )
    calls[reviewer.index] = bad
    with pytest.raises(ProgramError, match="does not reference an ancestor"):
        WorkflowProgram("tiny", "w", tuple(calls)).check_integrity()
    # A dependency on a later call (a cycle, once both wait on each other).
    calls = list(program.calls)
    calls[1] = replace(calls[1], dependencies=(calls[-1].call_id,))
    with pytest.raises(ProgramError, match="not an earlier call"):
        WorkflowProgram("tiny", "w", tuple(calls)).check_integrity()
    # Token counts that do not add up.
    calls = list(program.calls)
    calls[0] = replace(calls[0], prompt_tokens=calls[0].prompt_tokens + 1)
    with pytest.raises(ProgramError, match="sum of segments"):
        WorkflowProgram("tiny", "w", tuple(calls)).check_integrity()
