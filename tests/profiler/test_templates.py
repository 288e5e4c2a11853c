"""Prompt-composition templates from chained block hashes: inference, static prefixes, tenants."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes, sequence_hashes
from clairvoyant.profiler.core.confidence import ConfidenceConfig, Tier
from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import (
    CallRecord,
    IngestStatus,
    ProfileConfig,
)
from clairvoyant.profiler.core.store import ProfileStore
from clairvoyant.profiler.core.templates import ChainStore, TemplateConfig, TemplateLearner, static_run

pytestmark = pytest.mark.unit

VOCAB = 32_000
SYSTEM_TOKENS = 170  # 10 full blocks + 10 tokens: the static prefix is the 10 full blocks


def system_prompt(tenant: str, agent: str) -> list[int]:
    rng = np.random.default_rng([sum(map(ord, tenant)), sum(map(ord, agent))])
    return rng.integers(0, VOCAB, SYSTEM_TOKENS).tolist()


def fresh(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


def workflow_records(tenant: str, workflow_id: str, rng: np.random.Generator, t0: float) -> list[CallRecord]:
    """planner -> coder x3 (a conversation) -> summarizer -> reviewer, built from token lists:

    planner     system + task
    coder 1     planner's prompt + plan + instructions          (continues the planner's context)
    coder 2, 3  previous coder prompt + its reply + test output  (its own conversation)
    summarizer  last coder prompt + the first 1024 reply tokens + ask   (Listing 1's [0,1024])
    reviewer    system + the code (copied after a different prefix: invisible to chained hashes)
    """
    calls: list[tuple[str, list[int], list[int]]] = []
    planner_prompt = system_prompt(tenant, "planner") + fresh(rng, int(rng.integers(20, 200)))
    plan = fresh(rng, int(rng.integers(200, 300)))
    calls.append(("planner", planner_prompt, plan))
    prompt, reply = planner_prompt, plan
    for turn in range(3):
        base = prompt + reply
        extra = int(rng.integers(10, 120))
        if turn == 2:  # the last coder prompt ends on a block boundary, so 1024 reply tokens = 64 blocks
            extra += (-(len(base) + extra)) % BLOCK_TOKENS
        prompt = base + fresh(rng, extra)
        reply = fresh(rng, int(rng.integers(1100, 2500)))
        calls.append(("coder", prompt, reply))
    summary_prompt = prompt + reply[:1024] + fresh(rng, 40)
    calls.append(("summarizer", summary_prompt, fresh(rng, 80)))
    calls.append(("reviewer", system_prompt(tenant, "reviewer") + reply, fresh(rng, 200)))
    records = []
    for i, (agent, p, r) in enumerate(calls):
        prompt_blocks, response_blocks = sequence_hashes(p, r)
        records.append(
            CallRecord(
                f"{workflow_id}-{i}",
                workflow_id,
                agent,
                t0 + 2.0 * i,
                t0 + 2.0 * i + 1.0,
                len(p),
                len(r),
                workflow_end=i == len(calls) - 1,
                prompt_blocks=tuple(prompt_blocks),
                response_blocks=tuple(response_blocks),
            )
        )
    return records


def feed(profile: WorkflowProfile, n: int, seed: int = 0, tenant: str = "acme") -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        for r in workflow_records(tenant, f"w{i}", rng, 1000.0 * i):
            profile.ingest(r)


EXPECTED = {
    "planner": "${static:[0,$]}${new}",
    "coder": "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,$]}${new}",
    "summarizer": "${coder[-1]:prompt:[0,$]}${coder[-1]:response:[0,64]}${new}",
    "reviewer": "${static:[0,$]}${new}",
}


def test_templates_of_generated_prompts() -> None:
    profile = WorkflowProfile("acme", "codegen")
    feed(profile, 20)
    templates = profile.prompt_templates()
    assert {a: t.template for a, t in templates.items()} == EXPECTED
    # The first instance has no static prefix to match yet; every later one has.
    assert (templates["planner"].support, templates["planner"].calls) == (19, 20)
    # Two of each instance's three coder calls continue their own conversation; the first
    # continues the planner's: "${planner[-1]:prompt:[0,$]}${planner[-1]:response:[0,$]}${new}".
    assert (templates["coder"].support, templates["coder"].calls) == (40, 60)
    assert (templates["summarizer"].support, templates["summarizer"].calls) == (20, 20)
    coder = profile.templates.counts["coder"]
    assert coder.shapes["${planner[-1]:prompt:[0,$]}${planner[-1]:response:[0,*]}${new}"] == 20


def test_static_prefix_is_the_shared_system_prompt_run() -> None:
    profile = WorkflowProfile("acme", "codegen")
    feed(profile, 6)
    system = chain_hashes(system_prompt("acme", "planner"))
    assert len(system) == SYSTEM_TOKENS // BLOCK_TOKENS == 10
    assert profile.templates.static["planner"] == tuple(system)
    assert profile.prompt_templates()["planner"].static_blocks == 10
    # The coder's first prompt starts with the planner's system prompt too: it is the coder's
    # static prefix, but every coder prompt matches a longer in-instance source.
    assert profile.templates.static["coder"] == tuple(system)
    # The summarizer's prompt starts with the same system prompt as well.
    assert profile.templates.static["summarizer"] == tuple(system)


def test_static_run_needs_a_dominant_share() -> None:
    shared = chain_hashes(list(range(64)))  # 4 blocks
    other = chain_hashes(list(range(32)) + [7] * 32)  # shares 2 blocks
    assert static_run([shared, shared, other], 0.5) == tuple(shared)
    assert static_run([shared, other], 0.5) == tuple(shared[:2])  # both share the first 2 blocks
    assert static_run([shared], 0.5) == ()  # one instance is not "shared across instances"
    assert static_run([shared, other, other, other], 0.9) == tuple(shared[:2])


def test_relative_and_varying_ends() -> None:
    """A prompt reusing all but its source's last block (varying length) is written [0,$-1];
    one reusing a varying share of it is written [0,*] (it runs before b, which shares that much too:
    ties go to the most recent source)."""
    learner = TemplateLearner(TemplateConfig(static_window=1))  # no static prefix (one sample)
    rng = np.random.default_rng(3)
    for i in range(10):
        a_prompt = fresh(rng, 16 * int(rng.integers(5, 20)))
        a_reply = fresh(rng, 50)
        cut = a_prompt[: len(a_prompt) - 16] + fresh(rng, 30)
        varying = a_prompt[: 16 * int(rng.integers(1, 5))] + fresh(rng, 30)
        store = ChainStore(learner.config)
        for j, (agent, p, r) in enumerate(
            [("a", a_prompt, a_reply), ("c", varying, fresh(rng, 20)), ("b", cut, fresh(rng, 20))]
        ):
            pb, rb = sequence_hashes(p, r)
            store.add(f"{i}-{j}", agent, float(j), pb, rb)
        learner.learn(store.calls())
    templates = learner.templates()
    assert templates["a"].template == "${new}"
    assert templates["b"].template == "${a[-1]:prompt:[0,$-1]}${new}"
    assert templates["c"].template == "${a[-1]:prompt:[0,*]}${new}"
    assert (templates["c"].support, templates["c"].calls) == (10, 10)


def test_chain_store_deduplicates_a_growing_conversation() -> None:
    store = ChainStore(TemplateConfig())
    rng = np.random.default_rng(5)
    prompt: list[int] = fresh(rng, 160)
    total = 0
    for turn in range(10):
        reply = fresh(rng, 160)
        pb, rb = sequence_hashes(prompt, reply)
        total += len(pb) + len(rb)
        store.add(f"r{turn}", "chat", float(turn), pb, rb)
        prompt = prompt + reply + fresh(rng, 160)
    # Each turn adds its new 10 + reply 10 blocks; the history is stored once, not 10 times.
    assert store.blocks == 10 + 9 * 20 + 10 == 200
    assert total == sum(10 + 20 * t + 10 for t in range(10)) == 1100
    calls = store.calls()
    assert [len(c.chain) for c in calls] == [20 * (t + 1) for t in range(10)]
    restored = ChainStore.from_state(json.loads(json.dumps(store.to_state())), store.config)
    assert restored.calls() == calls


def test_chain_store_respects_its_budgets() -> None:
    store = ChainStore(TemplateConfig(max_chain_blocks=8, max_instance_blocks=20))
    rng = np.random.default_rng(6)
    first = sequence_hashes(fresh(rng, 160), fresh(rng, 64))
    assert store.add("r0", "a", 0.0, *first) and store.blocks == 8
    assert store.calls()[0].prompt_len == 8
    assert store.add("r1", "a", 1.0, *sequence_hashes(fresh(rng, 160), [])) and store.blocks == 16
    assert not store.add("r2", "a", 2.0, *sequence_hashes(fresh(rng, 160), []))
    assert store.blocks == 16


def test_annotation_serves_the_next_agents_template() -> None:
    config = ProfileConfig(confidence=ConfidenceConfig(min_instances=5, high_instances=10, min_window=5))
    profile = WorkflowProfile("acme", "codegen", config)
    rng = np.random.default_rng(7)
    records = [workflow_records("acme", f"w{i}", rng, 1000.0 * i) for i in range(40)]
    for r in records[0][:-1]:
        profile.ingest(r)
    assert profile.annotate("coder", "w0").next_prompt_template == ""  # SHADOW
    for r in records[0][-1:] + [r for rs in records[1:] for r in rs]:
        profile.ingest(r)
    assert profile.confidence.tier is not Tier.SHADOW
    live = workflow_records("acme", "live", rng, 1e6)
    profile.ingest(live[0])  # the planner finished: the coder comes next
    annotation = profile.annotate("coder", "live")
    assert annotation.next_agents[0][0] == "coder"
    assert annotation.next_prompt_template == EXPECTED["coder"]
    for r in live[1:4]:
        profile.ingest(r)
    assert profile.annotate("summarizer", "live").next_prompt_template == EXPECTED["reviewer"]


def test_state_round_trip_keeps_templates_and_open_chains() -> None:
    profile = WorkflowProfile("acme", "codegen")
    feed(profile, 8)
    live = workflow_records("acme", "open", np.random.default_rng(9), 1e6)
    for r in live[:3]:
        profile.ingest(r)
    state = json.loads(json.dumps(profile.to_state()))
    restored = WorkflowProfile.from_state(state)
    assert restored.prompt_templates() == profile.prompt_templates()
    assert restored.templates.static == profile.templates.static
    assert restored.to_state() == state
    for r in live[3:]:
        profile.ingest(r)
        restored.ingest(r)
    assert restored.prompt_templates() == profile.prompt_templates()
    assert restored.prompt_templates()["summarizer"].calls == 9


def test_no_template_or_profile_crosses_tenants() -> None:
    store = ProfileStore()
    rng_a, rng_b = np.random.default_rng(10), np.random.default_rng(10)
    for i in range(6):  # the same workflow and request ids in both tenants
        for r in workflow_records("acme", f"w{i}", rng_a, 1000.0 * i):
            assert store.ingest("acme", "codegen", r).status is IngestStatus.ACCEPTED
        for r in workflow_records("globex", f"w{i}", rng_b, 1000.0 * i):
            assert store.ingest("globex", "codegen", r).status is IngestStatus.ACCEPTED
    acme, globex = store.profile("acme", "codegen"), store.profile("globex", "codegen")
    assert acme.instances == globex.instances == 6
    assert acme.templates.static["planner"] == tuple(chain_hashes(system_prompt("acme", "planner")))
    assert globex.templates.static["planner"] == tuple(chain_hashes(system_prompt("globex", "planner")))
    assert not set(acme.templates.static["planner"]) & set(globex.templates.static["planner"])
    # A third tenant running the same workflow type learns from nothing the others sent.
    fresh_store = store.profile("initech", "codegen")
    assert fresh_store.prompt_templates() == {} and fresh_store.instances == 0
    assert store.annotate("initech", "codegen", "coder").next_prompt_template == ""
    assert store.annotate("umbrella", "codegen", "coder").confidence is Tier.NONE
