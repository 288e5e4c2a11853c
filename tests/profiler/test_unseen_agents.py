"""Agents a profile has never seen: name normalization (agent_names.py), length priors (priors.py),
their settings, and the per_task_experts evaluation (evaluation/synthetic.py)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError
from threadpoolctl import threadpool_limits

from clairvoyant.profiler.config import ProfilerSettings
from clairvoyant.profiler.core.agent_names import AgentNameConfig, AgentNames
from clairvoyant.profiler.core.priors import LengthPriors, PriorConfig, lead_agent
from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import CallRecord, ProfileConfig
from clairvoyant.profiler.core.stats import AgentSummary, LearnedAgentStats
from clairvoyant.profiler.core.trace import TraceCall, WorkflowTrace, build_trace
from clairvoyant.profiler.evaluation.data import timed_workflows
from clairvoyant.profiler.evaluation.synthetic import (
    EXPERTS,
    FAMILIES,
    MODES,
    ModeResult,
    compare,
    expert_family,
    per_task_expert_programs,
    with_models,
)
from tests.profiler.generators import S

pytestmark = pytest.mark.unit

PLANNER_BLOCKS = (1, 2, 3, 4, 5)
REVIEWER_BLOCKS = (11, 12, 13, 14, 15)
FAMILY_BLOCKS = ((101, 102, 103, 104), (201, 202, 203, 204))  # two expert system prompts


def quantiles(values: list[float]) -> tuple[float, float]:
    p50, p99 = np.quantile(values, [0.5, 0.99], method="higher")
    return float(p50), float(p99)


def chain(workflow_id: str, *agents: tuple[str, int]) -> WorkflowTrace:
    """One call per step, in order, with the given output lengths."""
    calls = [
        TraceCall(f"{workflow_id}/{i}", agent, 2.0 * i, 2.0 * i + 1.0, output_tokens=length)
        for i, (agent, length) in enumerate(agents)
    ]
    return build_trace(workflow_id, calls)


def expert_length(k: int) -> int:
    """Family 0 (even k) writes about 100 tokens, family 1 (odd k) about 1,000."""
    return 100 + k if k % 2 == 0 else 1000 + k


def records(i: int, k: int, *, end: bool = True) -> list[CallRecord]:
    """Workflow ``w<i>``: planner -> expert_<k> -> reviewer, prompts hashed per system prompt."""
    t = i * 100.0
    return [
        CallRecord(f"w{i}/0", f"w{i}", "planner", t, t + 1, output_tokens=200, prompt_blocks=PLANNER_BLOCKS),
        CallRecord(
            f"w{i}/1", f"w{i}", f"expert_{k}", t + 2, t + 3, output_tokens=expert_length(k),
            upstream_agent_id="planner", prompt_blocks=(*FAMILY_BLOCKS[k % 2], 9000 + i), model="small",
        ),
        CallRecord(
            f"w{i}/2", f"w{i}", "reviewer", t + 4, t + 5, output_tokens=50, upstream_agent_id=f"expert_{k}",
            prompt_blocks=REVIEWER_BLOCKS, workflow_end=end,
        ),
    ]  # fmt: skip


def profile_of(workflows: int, config: ProfileConfig | None = None) -> WorkflowProfile:
    """``workflows`` closed instances, each with a distinct expert (expert_0, expert_1, ...).  The
    path expression is synthesised once: lengths do not depend on it."""
    profile = WorkflowProfile("acme", "experts", replace(config or ProfileConfig(), resynthesize_every=10**6))
    for i in range(workflows):
        for r in records(i, i):
            profile.ingest(r)
    profile.refresh_tables()
    return profile


# ----------------------------------------------------------------------------- name normalization


def test_a_pattern_with_a_capture_group_names_the_agent_by_the_group() -> None:
    names = AgentNames(AgentNameConfig(pattern=r"^(expert)_\d+$"))
    assert names.lookup("expert_17") == "expert"
    assert names.lookup("planner") == "planner"
    assert names.lookup("expert_x") == "expert_x"  # no match: unchanged


def test_a_pattern_without_a_group_replaces_each_match() -> None:
    names = AgentNames(AgentNameConfig(pattern=r"\d+"))
    assert [names.lookup(a) for a in ("expert_17", "a1b22", "planner")] == ["expert_+", "a+b+", "planner"]
    emptied = AgentNames(AgentNameConfig(pattern=r"\d+", replacement=""))
    assert emptied.lookup("task_42") == "task_" and emptied.lookup("42") == "42"  # never an empty name


def test_a_bad_pattern_or_replacement_is_refused() -> None:
    with pytest.raises(ValueError, match="pattern"):
        AgentNames(AgentNameConfig(pattern="expert_("))
    with pytest.raises(ValueError, match="replacement"):
        AgentNames(AgentNameConfig(pattern=r"\d+", replacement="*"))  # not an agent-id character


def test_normalization_is_off_by_default() -> None:
    names = AgentNames()
    record = records(0, 3)[1]
    assert names.normalized(record) is record and names.lookup("expert_3") == "expert_3"
    assert ProfileConfig().agent_names == AgentNameConfig() and not AgentNameConfig().enabled


def test_agents_sharing_a_system_prompt_share_the_first_ones_name() -> None:
    names = AgentNames(AgentNameConfig(prompt_prefix_blocks=4))
    normalized = [names.normalized(r) for i, k in enumerate((4, 7, 2, 9)) for r in records(i, k)]
    assert [r.agent_id for r in normalized[1::3]] == ["expert_4", "expert_7", "expert_4", "expert_7"]
    assert {r.agent_id for r in normalized[0::3]} == {"planner"}  # alone with its prompt: kept
    # The upstream name follows the group its agent was grouped under.
    assert [r.upstream_agent_id for r in normalized[2::3]] == ["expert_4", "expert_7", "expert_4", "expert_7"]
    # Annotate has no prompt: ingested names take their group; new names keep theirs.
    assert [names.lookup(a) for a in ("expert_2", "expert_9", "expert_5")] == ["expert_4", "expert_7", "expert_5"]
    short = replace(records(9, 2)[1], prompt_blocks=(101, 102))  # too few blocks: its last group
    assert names.normalized(short).agent_id == "expert_4"


def test_a_pattern_applies_before_the_prompt_grouping() -> None:
    names = AgentNames(AgentNameConfig(pattern=r"^(expert)_\d+$", prompt_prefix_blocks=4))
    ids = [names.normalized(records(i, k)[1]).agent_id for i, k in enumerate((4, 7, 2))]
    assert ids == ["expert", "expert", "expert"]


def test_remembered_prefixes_are_bounded() -> None:
    def grouped(max_names: int) -> tuple[list[str], AgentNames]:
        names = AgentNames(AgentNameConfig(prompt_prefix_blocks=1, max_names=max_names))
        calls = [CallRecord(f"r{i}", "w", f"a{i}", 0, 1, prompt_blocks=(i % 3,)) for i in range(4)]
        return [names.normalized(r).agent_id for r in calls], names

    assert grouped(3)[0] == ["a0", "a1", "a2", "a0"]  # a3 has a0's prompt
    names, small = grouped(2)
    assert names == ["a0", "a1", "a2", "a3"]  # a0's prompt was forgotten
    assert len(small.to_state()["groups"]) == 2 and len(small.to_state()["aliases"]) == 2


# ------------------------------------------------------------------------------------- priors


def trained_priors(config: PriorConfig | None = None, traces: int = 40) -> LengthPriors:
    priors = LengthPriors(config)
    for i in range(traces):
        priors.note_model(f"expert_{i}", "coder" if i % 2 else "small")
        priors.observe(chain(f"w{i}", ("planner", 100), (f"expert_{i}", 200 + 10 * i), ("reviewer", 50)))
    return priors


def test_contexts_go_from_the_upstream_agent_to_the_whole_workflow_type() -> None:
    priors = LengthPriors()
    assert priors.contexts((S("planner"), S("b", "a", "b")), "coder") == ["after:b", "step:2", "model:coder", "all"]
    assert priors.contexts((), None) == ["step:0", "all"]
    assert priors.contexts(None, "coder") == ["model:coder", "all"]  # no position
    assert priors.contexts(tuple(S("a") for _ in range(40)), None)[1] == "step:32"  # max_step_index
    assert lead_agent(S("x", "y")) == "x" and lead_agent(S("y", "x", "y")) == "y"


def test_an_unseen_agent_gets_the_pooled_lengths_of_its_position() -> None:
    priors = trained_priors()
    experts = [200.0 + 10 * i for i in range(40)]
    assert priors.prior("expert_new", (S("planner"),)) == quantiles(experts) == (400.0, 590.0)
    assert priors.prior("planner_2", ()) == (100.0, 100.0)  # step 0: the planners
    # After an agent and at a step never seen: the agent's model, then the whole workflow type.
    unseen_position = (S("planner"), S("expert_3"), S("reviewer"))
    everything = [100.0] * 40 + experts + [50.0] * 40
    assert priors.prior("stranger", unseen_position) == quantiles(everything)
    coders = [200.0 + 10 * i for i in range(1, 40, 2)]
    modelled = trained_priors(PriorConfig(min_context_samples=20))
    assert modelled.prior("stranger", unseen_position, model="coder") == quantiles(coders)
    assert modelled.prior("expert_5", unseen_position) == quantiles(coders)  # its model, remembered


def test_a_context_with_too_few_lengths_is_skipped() -> None:
    priors = trained_priors(traces=10)  # 10 < min_context_samples everywhere but "all" (30)
    assert priors.prior("x", (S("planner"),)) is None
    assert trained_priors(traces=11).prior("x", (S("planner"),)) == quantiles(
        [100.0] * 11 + [200.0 + 10 * i for i in range(11)] + [50.0] * 11
    )


def own(length: float, samples: int) -> AgentSummary:
    stats = LearnedAgentStats("expert_7")
    for _ in range(samples):
        stats.add_call(length, 1.0, 2.0, None, None, 1)
    return stats.summary()


def test_the_prior_gives_way_to_the_agents_own_samples() -> None:
    priors = trained_priors()
    after = (S("planner"),)
    assert priors.length_interval("expert_7", None, None, after) == (400.0, 590.0)
    half = priors.length_interval("expert_7", own(1000.0, 8), None, after)
    weight = 8 / (8 + 8) * (1 - 8 / 16)  # k / (n + k), tapered to 0 at own_after
    assert half == pytest.approx(
        tuple(float(np.expm1(weight * np.log1p(p) + (1 - weight) * np.log1p(1000.0))) for p in (400.0, 590.0))
    )
    served = [priors.length_interval("expert_7", own(1000.0, n), None, after) for n in (1, 4, 8, 12, 15)]
    p99s = [590.0] + [interval[1] for interval in served if interval is not None] + [1000.0]
    assert p99s == sorted(p99s) and len(set(p99s)) == 7  # strictly toward its own
    assert priors.length_interval("expert_7", own(1000.0, 16), None, after) == (1000.0, 1000.0)


def test_without_priors_only_the_agents_own_samples_count() -> None:
    priors = trained_priors(PriorConfig(enabled=False))
    assert priors.prior("expert_new", (S("planner"),)) is None
    assert priors.length_interval("expert_new", None, None, (S("planner"),)) is None
    assert priors.length_interval("expert_7", own(1000.0, 2), None, (S("planner"),)) == (1000.0, 1000.0)
    assert priors.to_state() == {"pools": [], "models": []}


def test_pools_are_bounded() -> None:
    priors = trained_priors(PriorConfig(window=16, max_contexts=3, max_models=5))
    state = priors.to_state()
    assert [key for key, _ in state["pools"]] == ["after:expert_39", "step:2", "all"]  # last fed
    assert all(len(values) <= 16 for _, values in state["pools"]) and len(state["models"]) == 5


# --------------------------------------------------------------------------- in a workflow profile


def test_a_profile_annotates_an_unseen_agent_with_its_positions_prior() -> None:
    profile = profile_of(40)
    profile.ingest(records(100, 100, end=False)[0])  # w100's planner has run
    annotation = profile.annotate("expert_500", "w100")
    experts = [float(expert_length(k)) for k in range(40)]
    assert (annotation.output_len_p50, annotation.output_len_p99) == quantiles(experts)
    fresh = profile.annotate("planner_2", "w101")  # a workflow not started: its first step
    assert (fresh.output_len_p50, fresh.output_len_p99) == (200.0, 200.0)
    nowhere = profile.annotate("stranger")  # no workflow: its model's or the whole type's lengths
    everything = [200.0] * 40 + experts + [50.0] * 40
    assert (nowhere.output_len_p50, nowhere.output_len_p99) == quantiles(everything)
    unprimed = profile_of(40, ProfileConfig(priors=PriorConfig(enabled=False)))
    unprimed.ingest(records(100, 100, end=False)[0])
    assert unprimed.annotate("expert_500", "w100").output_len_p99 is None


def test_a_pattern_folds_the_experts_into_one_agent() -> None:
    profile = profile_of(40, ProfileConfig(agent_names=AgentNameConfig(pattern=r"^(expert)_\d+$")))
    assert sorted(profile.agents) == ["expert", "planner", "reviewer"]
    assert profile.agents["expert"].calls == 40
    summary = profile.agent_summaries()["expert"]
    assert summary.output_len is not None
    profile.ingest(records(100, 100, end=False)[0])
    annotation = profile.annotate("expert_12345", "w100")  # never seen, but its pattern's
    assert annotation.output_len_p99 == pytest.approx(summary.output_len.p99)  # = its position's prior


def test_prompt_groups_keep_the_families_apart() -> None:
    own_only = PriorConfig(own_after=16)  # each group's 20 calls are its own interval
    profile = profile_of(40, ProfileConfig(agent_names=AgentNameConfig(prompt_prefix_blocks=4), priors=own_only))
    assert sorted(profile.agents) == ["expert_0", "expert_1", "planner", "reviewer"]
    short, long = (profile.annotate(f"expert_{k}") for k in (38, 39))  # ingested: their groups
    assert short.output_len_p99 == pytest.approx(profile.agent_summaries()["expert_0"].output_len.p99)  # type: ignore[union-attr]
    assert long.output_len_p99 == pytest.approx(profile.agent_summaries()["expert_1"].output_len.p99)  # type: ignore[union-attr]
    assert short.output_len_p99 is not None and long.output_len_p99 is not None
    assert short.output_len_p99 < 500 < long.output_len_p99
    profile.ingest(records(200, 200, end=False)[0])
    stranger = profile.annotate("expert_1001", "w200")  # never ingested: keeps its name, gets the prior
    assert stranger.output_len_p99 == quantiles([float(expert_length(k)) for k in range(40)])[1]


def test_names_and_priors_survive_the_state_round_trip() -> None:
    config = ProfileConfig(agent_names=AgentNameConfig(pattern=r"\d+", prompt_prefix_blocks=4))
    profile = profile_of(40, config)
    state = json.loads(json.dumps(profile.to_state()))
    restored = WorkflowProfile.from_state(state)
    assert restored.to_state() == state and restored.config == profile.config
    assert restored.config.agent_names == config.agent_names
    def interval(p: WorkflowProfile, agent_id: str) -> tuple[float | None, float | None]:
        annotation = p.annotate(agent_id, "w50")
        return annotation.output_len_p50, annotation.output_len_p99

    for r in records(50, 50):  # both keep learning alike
        assert interval(restored, "expert_777") == interval(profile, "expert_777")
        profile.ingest(r)
        restored.ingest(r)
    assert restored.to_state() == profile.to_state()


def test_a_state_saved_before_names_and_priors_loads_with_the_defaults() -> None:
    state = json.loads(json.dumps(profile_of(40).to_state()))
    for key in ("agent_names", "priors"):
        del state[key]
        del state["config"][key]
    old = WorkflowProfile.from_state(state)
    assert old.config.agent_names == AgentNameConfig() and old.config.priors == PriorConfig()
    assert old.priors.to_state() == {"pools": [], "models": []}
    assert old.annotate("expert_3").output_len_p99 == 1003.0  # its own sample: no pooled lengths yet


# --------------------------------------------------------------------------------- the service


def test_the_settings_reach_the_profile_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ProfilerSettings().profile_config().agent_names == AgentNameConfig()
    assert ProfilerSettings().profile_config().priors.enabled
    monkeypatch.setenv("CV_AGENT_NAME_PATTERN", r"^(expert)_\d+$")
    monkeypatch.setenv("CV_AGENT_PROMPT_PREFIX_BLOCKS", "4")
    monkeypatch.setenv("CV_LENGTH_PRIOR", "false")
    config = ProfilerSettings().profile_config()
    assert config.agent_names == AgentNameConfig(pattern=r"^(expert)_\d+$", prompt_prefix_blocks=4)
    assert not config.priors.enabled


@pytest.mark.parametrize(
    "settings", [{"agent_name_pattern": "expert_("}, {"agent_name_pattern": "x", "agent_name_replacement": "a b"}]
)
def test_bad_naming_settings_fail_at_start(settings: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        ProfilerSettings(**settings)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the evaluation

WORKFLOWS = 400
SEED = 0


def test_the_generator_names_most_experts_once() -> None:
    programs = per_task_expert_programs(WORKFLOWS, seed=SEED)
    assert programs == per_task_expert_programs(WORKFLOWS, seed=SEED)
    for program in programs:
        program.check_integrity()
    assert [c.agent_id for c in programs[0].calls][::2] == ["planner", "reviewer"]
    experts = Counter(p.calls[1].agent_id for p in programs)
    assert all(1 <= int(name.split("_")[1]) <= EXPERTS for name in experts)
    assert len(experts) >= 100 and sum(n == 1 for n in experts.values()) >= 0.4 * len(experts)
    assert experts.most_common(1)[0][0] == "expert_1"
    for program in programs[:30]:  # an expert's system prompt and model are its family's
        k = int(program.calls[1].agent_id.split("_")[1])
        assert program.calls[1].prompt[0].agent_id == expert_family(k).system_prompt  # type: ignore[union-attr]
        assert program.calls[1].model == expert_family(k).model
    assert len({f.system_prompt for f in FAMILIES}) == len(FAMILIES)


@pytest.fixture(scope="module")
def coverage() -> dict[str, ModeResult]:
    programs = per_task_expert_programs(WORKFLOWS, seed=SEED)
    workflows = with_models(timed_workflows(programs, seed=SEED, concurrency=8.0, hash_tokens=512), programs)
    assert {r.model for w in workflows for r in w.records} == {"large", "small", "coder"}
    # The length interval does not depend on the path model: synthesis (costly over 150 names)
    # runs once per mode.  One BLAS thread: the Kairos rank's eigendecomposition over ~110 agents
    # is several times slower with a thread pool on two shared cores.  Without priors ("off"),
    # coverage is 0.90 (python -m clairvoyant.profiler.evaluation.synthetic).
    modes = {mode: replace(MODES[mode], resynthesize_every=10**6) for mode in ("prior", "pattern", "prompt_hash")}
    with threadpool_limits(1, "blas"):
        return compare(workflows, 0.3, modes)


def test_priors_and_normalization_cover_per_task_experts(coverage: dict[str, ModeResult]) -> None:
    for mode in ("prior", "pattern", "prompt_hash"):
        assert coverage[mode].coverage >= 0.97, (mode, coverage[mode])
    assert coverage["prior"].agents > 100  # the prior renames nothing: every expert seen is an agent
    assert coverage["pattern"].agents == 3 and coverage["prompt_hash"].agents == 2 + len(FAMILIES)
