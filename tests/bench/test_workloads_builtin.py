"""The built-in workloads: they load, generate sound programs, and reproduce their sources' numbers."""

from __future__ import annotations

import math
from collections import defaultdict
from functools import cache

import numpy as np
import pytest

from clairvoyant.bench.workloads import (
    WORKLOADS,
    SpecWorkload,
    WorkflowProgram,
    Workload,
    WorkloadDataError,
    get_workload,
    list_workloads,
)
from clairvoyant.workloads.registry import BUILTIN_DIR, MIX_WORKLOADS, TRACE_WORKLOADS
from clairvoyant.workloads.spec import load_spec

pytestmark = pytest.mark.unit

SPEC_WORKLOADS = [
    "coding_assistant",
    "deep_research",
    "qa_router",
    "report_generate",
    "code_generate",
    "chatbot",
    "react_bfcl",
    "mcts_lats",
    "swe_agent",
    "webarena",
    "self_refine",
    "voting",
    "task_decomposition",
    "text_to_sql",
]
ALL_WORKLOADS = SPEC_WORKLOADS + ["chatdev", "claude_code"]
# Context windows of the served models the built-ins name (HF config.json max_position_embeddings).
CONTEXT = {
    "qwen2.5-7b": 32_768,
    "qwen2.5-14b": 32_768,
    "qwen2.5-32b": 32_768,
    "llama-3.1-8b": 131_072,
    "llama-3.1-70b": 131_072,
}


@cache
def workload(name: str) -> Workload:
    return get_workload(name)


def available(name: str) -> Workload:
    try:
        return workload(name)
    except WorkloadDataError as exc:
        pytest.skip(str(exc))


def sample(w: Workload, count: int, seed: int = 0) -> list[WorkflowProgram]:
    rng = np.random.default_rng(seed)
    return [w.instantiate(rng, f"{w.name}-{i}") for i in range(count)]


def test_every_workload_is_registered() -> None:
    assert sorted(list_workloads()) == sorted(ALL_WORKLOADS + list(MIX_WORKLOADS))  # mixes: test_workloads_mix.py
    assert sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")) == sorted(SPEC_WORKLOADS)
    assert set(TRACE_WORKLOADS) <= set(WORKLOADS)
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        get_workload("nope")


@pytest.mark.parametrize("name", SPEC_WORKLOADS)
def test_builtin_specs_validate_and_name_themselves(name: str) -> None:
    spec = load_spec(BUILTIN_DIR / f"{name}.yaml")
    assert spec.name == name and spec.description
    w = workload(name)
    assert isinstance(w, SpecWorkload)
    stats = w.stats()
    assert stats.calls_per_workflow > 0 and stats.max_calls_per_workflow >= stats.calls_per_workflow
    assert set(stats.agents) == set(spec.agents)
    assert set(w.served_models()) <= set(CONTEXT)


def independent_check(program: WorkflowProgram) -> None:
    """Acyclic dependencies and composition segments pointing at earlier calls (ancestors), written
    without trusting WorkflowProgram.check_integrity."""
    seen: dict[str, int] = {}
    ancestors: dict[str, set[str]] = {}
    for position, call in enumerate(program.calls):
        assert call.call_id not in seen
        mine: set[str] = set()
        for dep in call.dependencies:
            assert dep in seen, f"{call.call_id} depends on {dep}, not an earlier call"
            mine |= {dep} | ancestors[dep]
        ancestors[call.call_id] = mine
        seen[call.call_id] = position
        total = 0
        for seg in call.prompt:
            total += seg.tokens
            assert seg.tokens > 0
            if seg.kind == "call":
                assert seg.call_id in mine, f"{call.call_id} reads {seg.call_id}, not an ancestor"
                ref = program.calls[seen[seg.call_id]]
                assert seg.tokens <= (ref.prompt_tokens if seg.part == "prompt" else ref.output_tokens)
            elif seg.kind == "system":
                assert seg.agent_id == call.agent_id
        assert total == call.prompt_tokens and call.output_tokens >= 1


@pytest.mark.parametrize("name", ALL_WORKLOADS)
def test_programs_are_dags_whose_segments_reference_earlier_calls(name: str) -> None:
    w = available(name)
    for program in sample(w, 20 if name in TRACE_WORKLOADS else 30, seed=11):
        program.check_integrity()
        independent_check(program)
        assert program.workflow_type == name
        # Every served model is one the workload declares.
        assert {c.model for c in program.calls} <= set(w.served_models())


@pytest.mark.parametrize("name", SPEC_WORKLOADS)
def test_prompts_and_outputs_fit_the_models_context(name: str) -> None:
    w = workload(name)
    for program in sample(w, 40, seed=3):
        for call in program.calls:
            assert call.prompt_tokens + call.output_tokens <= CONTEXT[call.model], call


@pytest.mark.parametrize("name", ALL_WORKLOADS)
def test_same_seed_same_programs(name: str) -> None:
    w = available(name)
    first, again = sample(w, 5, seed=42), sample(w, 5, seed=42)
    assert first == again
    assert sample(w, 5, seed=43) != first


def _agent_samples(name: str) -> tuple[dict[str, list[int]], int]:
    """Enough workflows that every agent's mean output has a standard error of about 1.25%."""
    w = workload(name)
    stats = w.stats()
    needed = 1
    for agent in stats.agents.values():
        calls = max(1000.0, (agent.output_cv / 0.0125) ** 2)
        needed = max(needed, math.ceil(calls / agent.calls_per_workflow))
    needed = min(needed, 6000)
    outputs: dict[str, list[int]] = defaultdict(list)
    for program in sample(w, needed, seed=1):
        for call in program.calls:
            outputs[call.agent_id].append(call.output_tokens)
    return outputs, needed


@pytest.mark.parametrize("name", SPEC_WORKLOADS)
def test_generated_output_lengths_match_the_configured_mean_and_cv(name: str) -> None:
    """Per agent: mean within 5% and CV within 10% of what stats() reports (the spec's numbers)."""
    outputs, workflows = _agent_samples(name)
    stats = workload(name).stats()
    for agent, configured in stats.agents.items():
        values = np.asarray(outputs[agent], dtype=float)
        assert len(values) / workflows == pytest.approx(configured.calls_per_workflow, rel=0.08), agent
        assert values.mean() == pytest.approx(configured.output_mean, rel=0.05), agent
        cv = values.std() / values.mean()
        assert cv == pytest.approx(configured.output_cv, rel=0.10, abs=0.01), agent


def test_coding_assistant_is_pythia_table_1() -> None:
    table_1 = {  # Pythia Table 1: role -> (avg output length, CV)
        "explorer": (1924, 0.45),
        "chronicler": (912, 0.26),
        "architect": (1194, 0.22),
        "planner": (60, 0.15),
        "engineer": (3152, 0.45),
        "reviewer": (2620, 0.18),
        "verifier": (65, 0.16),
    }
    stats = workload("coding_assistant").stats()
    assert {a: (s.output_mean, s.output_cv) for a, s in stats.agents.items()} == table_1
    assert stats.agents["engineer"].model != stats.agents["architect"].model  # code model + reasoning model
    program = workload("coding_assistant").instantiate(np.random.default_rng(2), "w")
    explorers = [c for c in program.calls if c.agent_id == "explorer"]
    assert len({c.dependencies for c in explorers}) == 1  # parallel explorers off the planner
    assert all(
        c.tool == "executor" and c.tool_latency_s > 0 for c in program.calls if c.agent_id == "engineer"
    )


def _calls(programs: list[WorkflowProgram]) -> list[int]:
    return [len(p) for p in programs]


def test_chatbot_calls_per_program() -> None:
    programs = sample(workload("chatbot"), 5000, seed=4)
    calls = _calls(programs)
    assert np.mean(calls) == pytest.approx(6.66, rel=0.05)  # Autellix §6.1: mean 6.66, max 80
    assert max(calls) <= 80 and np.percentile(calls, 99) > 4 * np.median(calls)  # long-tailed
    per_call_output = np.mean([c.output_tokens for p in programs for c in p.calls])
    assert per_call_output == pytest.approx(277, rel=0.05)


def test_react_bfcl_calls_prefill_and_decode() -> None:
    programs = sample(workload("react_bfcl"), 2000, seed=5)
    calls = [c for p in programs for c in p.calls]
    assert np.mean(_calls(programs)) == pytest.approx(10.75, rel=0.05)  # Autellix §6.1
    assert max(_calls(programs)) <= 70
    assert np.mean([c.prompt_tokens for c in calls]) == pytest.approx(735.06, rel=0.05)
    assert np.mean([c.output_tokens for c in calls]) == pytest.approx(34.14, rel=0.05)
    # Each step continues the previous one: its whole prompt and reply are a prefix of the next.
    second = programs[0].calls[1]
    assert [s.kind for s in second.prompt[:2]] == ["call", "call"]


def test_mcts_lats_calls_and_parallelism() -> None:
    programs = sample(workload("mcts_lats"), 300, seed=6)
    calls = [c for p in programs for c in p.calls]
    assert np.mean(_calls(programs)) == pytest.approx(159.7, rel=0.06)  # Autellix §6.1
    assert np.mean([c.prompt_tokens for c in calls]) == pytest.approx(467.2, rel=0.03)
    assert np.mean([c.output_tokens for c in calls]) == pytest.approx(72.6, rel=0.03)
    # Highly parallel: five expansions share each set of dependencies.
    widths: dict[tuple[str, ...], int] = defaultdict(int)
    for c in programs[0].calls:
        if c.agent_id == "expand":
            widths[c.dependencies] += 1
    assert set(widths.values()) == {5}


def test_swe_agent_steps_and_growing_context() -> None:
    programs = sample(workload("swe_agent"), 2000, seed=7)
    steps = _calls(programs)
    assert np.mean(steps) == pytest.approx(37, rel=0.05)  # SAGA §9.1: mean 37 steps
    assert max(steps) <= 150 and max(steps) > 100  # long tail to 150
    first_prompts = [p.calls[0].prompt_tokens for p in programs]
    assert min(first_prompts) >= 2000 and max(first_prompts) <= 4000  # SAGA §2.1: starts at 2-4K
    longest = max(programs, key=len)
    sizes = [c.prompt_tokens for c in longest.calls]
    assert sizes == sorted(sizes) and sizes[-1] > 16_000  # accumulates
    outputs = [c.output_tokens for p in programs[:200] for c in p.calls]
    assert min(outputs) >= 100 and max(outputs) <= 500
    assert {c.tool for p in programs[:50] for c in p.calls} == {"code_execution", "file_operation"}


def test_webarena_steps_and_prompt_sizes() -> None:
    programs = sample(workload("webarena"), 800, seed=8)
    assert np.mean(_calls(programs)) == pytest.approx(18, rel=0.05)  # SAGA §9.1
    prompts = np.array([c.prompt_tokens for p in programs for c in p.calls])
    assert prompts.min() >= 3900 and prompts.max() <= 8100  # 4-8K per step


def test_qa_router_branches_evenly() -> None:
    programs = sample(workload("qa_router"), 2000, seed=9)
    experts = [p.calls[1].agent_id for p in programs]
    assert all(p.calls[0].agent_id == "router" for p in programs)
    assert experts.count("math") / len(experts) == pytest.approx(0.5, abs=0.03)


def test_code_generate_feedback_loop() -> None:
    programs = sample(workload("code_generate"), 2000, seed=10)
    rounds = [sum(c.agent_id == "engineer" for c in p.calls) for p in programs]
    assert np.mean(rounds) == pytest.approx(1 + 0.4 + 0.16 + 0.064, rel=0.05)
    assert max(rounds) == 4
    order = [c.agent_id for c in programs[0].calls[:4]]
    assert order == ["product_manager", "architect", "project_manager", "engineer"]


def test_deep_research_summarizer_joins_researchers() -> None:
    for program in sample(workload("deep_research"), 30, seed=12):
        for call in program.calls:
            if call.agent_id == "summarizer":
                joined = [program.call(d) for d in call.dependencies]
                assert len(joined) >= 2 and all(c.agent_id == "researcher" for c in joined)
                read = {s.call_id for s in call.prompt if s.kind == "call" and s.part == "response"}
                assert set(call.dependencies) <= read
            if call.agent_id == "decomposer" and call.index > 0:
                assert call.prompt[0].kind == "call"  # keeps its context across turns


@pytest.mark.parametrize("name", ["self_refine", "voting", "task_decomposition", "text_to_sql"])
def test_aragog_stages_offer_alternative_models(name: str) -> None:
    program = workload(name).instantiate(np.random.default_rng(0), "w")
    for call in program.calls:
        assert call.model == "qwen2.5-32b"
        assert set(call.alternative_models) == {"qwen2.5-7b", "qwen2.5-14b"}


def test_aragog_builtins_average_5_2_calls() -> None:
    means = [
        workload(n).stats().calls_per_workflow
        for n in ["self_refine", "voting", "task_decomposition", "text_to_sql"]
    ]
    assert np.mean(means) == pytest.approx(5.2, abs=0.1)  # Aragog §2.1: 5.2 LLM calls per request
