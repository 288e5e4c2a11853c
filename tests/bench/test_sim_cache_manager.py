"""The cache manager in the simulator: what it hears, when its directives act, and what they change."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from clairvoyant.bench.experiment import (
    ExperimentConfig,
    build_cluster,
    check_tiers,
    config_dict,
    instance,
    replica_spec,
    run_sim,
    shared_l3,
)
from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.annotations import OracleAnnotator
from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.bench.sim.simulator import CacheManagerDelays, Simulator
from clairvoyant.bench.workloads import get_workload
from clairvoyant.core.blockhash import chain_hashes
from clairvoyant.policy.cache import BlockUse, CacheDirective, CacheView, CompletedCall
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, CallSegment, NewSegment, SystemSegment, WorkflowProgram

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

MODEL = "qwen2.5-14b"
SEED = 5
SYSTEM = 512  # the second agent's system prompt: 32 blocks nobody computes before it runs
TOOL_S = 2.0


def two_calls(wf: str) -> WorkflowProgram:
    """``planner`` reads a fresh context; after a tool, ``coder`` reads its own system prompt, then
    the planner's prompt and response."""
    first = Call(f"{wf}/0", 0, "planner", MODEL, (NewSegment("new", 300),), 300, 20, (),
                 tool="search", tool_latency_s=TOOL_S)  # fmt: skip
    second = Call(f"{wf}/1", 1, "coder", MODEL, (SystemSegment("system", "coder", SYSTEM),
                  CallSegment("call", first.call_id, "prompt", 300), CallSegment("call", first.call_id, "response", 20)),
                  SYSTEM + 320, 10, (first.call_id,))  # fmt: skip
    return WorkflowProgram("cm", wf, (first, second))


def system_prompt(agent: str, tokens: int = SYSTEM) -> tuple[int, ...]:
    """The token ids the simulator gives ``agent``'s system prompt (PromptBook, same seed)."""
    probe = Call("probe/0", 0, agent, MODEL, (SystemSegment("system", agent, tokens),), tokens, 1, ())
    return tuple(PromptBook(SEED).prompt("cm", probe))


def one_replica(host_cache: str = "0") -> list[Any]:
    config = ExperimentConfig(workload="coding_assistant", gpus=1, host_cache=host_cache)
    runner = EmulatedRunner(MODEL, config.gpu, 1, sleep=lambda seconds: None, distinct_tokens=True)
    return [replica_spec("r0", runner, config, shared_l3([runner], config))]


class Recording:
    """Records every completion; no directives."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, CompletedCall]] = []

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        self.seen.append((now, call))
        return []

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None


class PrePrefills(Recording):
    """On a planner's completion, pre-prefills ``agent``'s system prompt on the call's worker."""

    def __init__(self, agent: str) -> None:
        super().__init__()
        self.agent = agent

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        super().on_completion(call, view, now)
        if call.app_metadata is None or call.app_metadata.agent_id != "planner":
            return []
        directive = CacheDirective("pre_prefill", call.worker_id, call.tenant, token_ids=system_prompt(self.agent),
                                   speculative=True, reason="next agent")  # fmt: skip
        return [directive]


def simulate(
    policy: Any,
    *,
    workflows: int = 1,
    delays: CacheManagerDelays | None = None,
    annotator: OracleAnnotator | None = None,
) -> tuple[Simulator, RunRecords]:
    delays = delays or CacheManagerDelays()
    sim = Simulator(one_replica(), "fcfs-rr", seed=SEED, cache_policy=policy, cachemgr_delays=delays,
                    annotator=annotator, record_completions=True)  # fmt: skip
    arrivals = [(5.0 * i, two_calls(f"wf{i}")) for i in range(workflows)]
    return sim, sim.run(arrivals)


def coder(records: RunRecords, wf: str = "wf0") -> Any:
    return next(c for c in records.calls if c.call_id == f"{wf}/1")


# ---- lru: a cache manager that directs nothing changes nothing ------------------------------------


def cluster_run(cache_policy: str | None) -> RunRecords:
    config = ExperimentConfig(workload="coding_assistant", gpus=2, workflows=12, concurrency=6, seed=1,
                              host_cache="1", l3="memory")  # fmt: skip
    replicas, service = build_cluster(get_workload(config.workload), config)
    arrivals, backlog = instance(get_workload(config.workload), config)
    sim = Simulator(
        replicas, "clairvoyant", seed=config.seed, service_times=service, cache_policy=cache_policy
    )
    return sim.run(arrivals, backlog=backlog)


def test_lru_gives_the_records_of_a_run_without_a_cache_manager() -> None:
    plain, managed = cluster_run(None), cluster_run("lru")
    assert plain.cache_manager is None
    assert [dataclasses.astuple(c) for c in managed.calls] == [dataclasses.astuple(c) for c in plain.calls]
    assert [w.jct_s for w in managed.workflows] == [w.jct_s for w in plain.workflows]
    assert managed.duration_s == plain.duration_s and managed.kv_tiers == plain.kv_tiers
    totals = managed.cache_manager
    assert totals is not None and totals.policy == "lru"
    assert totals.completions_seen == len(managed.calls) > 0
    assert totals.events_seen > 0
    assert totals.directives_issued == {} and totals.speculative_tokens == 0


# ---- what the policy hears ------------------------------------------------------------------------


def test_every_completion_reaches_the_policy_in_order_with_its_tokens_and_annotations() -> None:
    policy = Recording()
    delays = CacheManagerDelays(completion_s=0.25)
    sim, records = simulate(policy, workflows=2, delays=delays, annotator=OracleAnnotator())
    ends = {c.call_id: c.end_time for c in records.calls if c.end_time is not None}
    ended = sorted(ends, key=lambda call_id: (ends[call_id], call_id))
    assert len(ended) == 4
    assert [call.request_id for _, call in policy.seen] == ended
    assert [now for now, _ in policy.seen] == [ends[call_id] + 0.25 for call_id in ended]
    assert [call.request_id for call in sim.completions] == ended
    calls = {call.request_id: call for _, call in policy.seen}
    first, second = calls["wf0/0"], calls["wf0/1"]
    assert (len(first.prompt_token_ids), len(first.output_token_ids)) == (300, 20)
    assert (len(second.prompt_token_ids), len(second.output_token_ids)) == (SYSTEM + 320, 10)
    # the coder's prompt is its system prompt, then the planner's prompt and response as generated
    assert second.prompt_token_ids == system_prompt("coder") + first.prompt_token_ids + first.output_token_ids
    assert list(second.prompt_block_hashes) == chain_hashes(second.prompt_token_ids)
    assert len(second.prompt_block_hashes) == (SYSTEM + 320) // 16
    assert second.app_metadata is not None and second.app_metadata.upstream_agent_id == "planner"
    assert second.app_metadata.tool == "search" and second.app_metadata.workflow_end is True
    assert first.annotations is not None and second.annotations is not None
    assert (
        first.annotations.expected_remaining_steps == 1.0
        and second.annotations.expected_remaining_steps == 0.0
    )
    assert [a.agent_id for a in first.annotations.next_agents] == ["coder"]
    assert first.cached_tokens == 0 and first.ok and first.worker_id == "r0"


# ---- directives act on the replicas ---------------------------------------------------------------


def test_a_pre_prefill_makes_the_next_call_hit_its_system_prompt() -> None:
    _, plain = simulate(Recording())
    policy = PrePrefills("coder")
    sim, managed = simulate(policy)
    assert coder(plain).cached_tokens == 0
    assert coder(managed).cached_tokens == SYSTEM  # its 32 blocks, computed during the planner's tool
    assert (
        coder(managed).first_token_time - coder(managed).start_time
        < coder(plain).first_token_time - coder(plain).start_time
    )
    totals = managed.cache_manager
    assert totals is not None
    assert totals.directives_issued == {"pre_prefill": 1} == totals.directives_applied
    assert totals.speculative_tokens == totals.speculative_tokens_used == SYSTEM
    assert totals.wasted_speculative_tokens == 0


def test_a_speculation_never_used_is_counted_wasted() -> None:
    sim, records = simulate(PrePrefills("reviewer"))  # no reviewer ever runs
    totals = records.cache_manager
    assert totals is not None
    assert totals.speculative_tokens == SYSTEM and totals.speculative_tokens_used == 0
    assert totals.wasted_speculative_tokens == SYSTEM
    assert coder(records).cached_tokens == 0


def test_a_directive_applies_after_the_completion_and_directive_delays() -> None:
    delays = CacheManagerDelays(completion_s=0.125, directive_s=0.5)
    sim, records = simulate(PrePrefills("coder"), delays=delays)
    assert sim.cache_manager is not None
    planner = next(c for c in records.calls if c.call_id == "wf0/0")
    [(applied, directive)] = sim.cache_manager.applied_at
    assert directive.kind == "pre_prefill"
    assert planner.end_time is not None and applied == pytest.approx(planner.end_time + 0.625)


def test_a_directive_too_late_for_its_call_serves_the_next_workflow() -> None:
    delays = CacheManagerDelays(directive_s=TOOL_S + 1.0)  # lands after wf0's coder, before wf1's
    _, records = simulate(PrePrefills("coder"), workflows=2, delays=delays)
    assert coder(records, "wf0").cached_tokens == 0
    assert coder(records, "wf1").cached_tokens == SYSTEM
    totals = records.cache_manager
    assert totals is not None
    assert totals.directives_issued == {"pre_prefill": 2} and totals.directives_applied == {"pre_prefill": 1}
    assert totals.speculative_tokens == totals.speculative_tokens_used == SYSTEM


def test_a_refused_directive_is_counted() -> None:
    class Retains(Recording):
        def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
            if call.request_id != "wf0/0":
                return []  # the run ends with the last call: what it would direct acts on nothing
            return [CacheDirective("retain", call.worker_id, call.tenant, workflow_id="wf0", ttl_s=5.0),
                    CacheDirective("drop", "gone", call.tenant)]  # fmt: skip

    _, records = simulate(Retains())  # no host cache: a retain needs KV tiers; worker "gone" is no replica
    totals = records.cache_manager
    assert totals is not None
    assert totals.directives_issued == {"drop": 1, "retain": 1} == totals.directives_refused
    assert totals.directives_applied == {}


def test_bad_delays_are_refused() -> None:
    with pytest.raises(ValueError):
        Simulator(
            one_replica(), "fcfs-rr", cache_policy="lru", cachemgr_delays=CacheManagerDelays(tick_s=0.0)
        )


def test_the_core_ticks_every_tick_interval_while_the_run_goes() -> None:
    class Ticks(Recording):
        def __init__(self) -> None:
            super().__init__()
            self.ticks: list[float] = []

        def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
            self.ticks.append(now)
            return []

    policy = Ticks()
    _, records = simulate(policy, delays=CacheManagerDelays(tick_s=0.5))
    assert records.duration_s == pytest.approx(2.3957, abs=1e-3)  # the run, not a tick after it
    assert policy.ticks == [0.5, 1.0, 1.5, 2.0]


# ---- the experiment ---------------------------------------------------------------------------------


def test_an_experiment_reports_the_cache_manager_only_with_a_cache_policy() -> None:
    config = ExperimentConfig(
        workload="coding_assistant", gpus=2, workflows=3, seed=2, host_cache="1", l3="memory"
    )
    assert not {"cache_policy", "l1_fraction"} & set(config_dict(config))
    plain = run_sim(config, "fcfs-rr")
    managed = run_sim(dataclasses.replace(config, cache_policy="lmcache", l1_fraction=0.5), "fcfs-rr")
    assert "cache_manager" not in plain
    cache = managed["cache_manager"]
    assert cache["policy"] == "lmcache" and cache["directives_applied"]["write_back"] > 0
    assert cache["hit_ratio"] == managed["kv_tiers"]["hit_ratio"]
    assert cache["ttft_s_by_agent"] == pytest.approx(managed["ttft_s_by_agent"])
    assert config_dict(dataclasses.replace(config, cache_policy="lru"))["cache_policy"] == "lru"
    with pytest.raises(ValueError, match="unknown cache policy"):
        check_tiers(dataclasses.replace(config, cache_policy="belady"))
    with pytest.raises(ValueError, match="l1_fraction"):
        check_tiers(dataclasses.replace(config, l1_fraction=0.0))
