"""Pythia's Algorithm 1 end to end in pure cores: the profiler's core learns a workflow from its
records (block hashes and all), annotates the next instance's calls, and the cache manager's core
runs the ``pythia`` policy on each completion, with the KV events a worker would have sent.

Four shapes: a chain, a loop, a fan-out and a rework.  In each, the dead lineages are dropped and
the live ones kept; the assembled next prompt is the prompt the application then sends, token for
token, up to its new part; and a wrong prediction costs L2 space only.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from clairvoyant.cachemgr.core import CacheManagerCore
from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import BLOCK_TOKENS, sequence_hashes
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy.cache import CacheDirective, CompletedCall, WorkerLoad
from clairvoyant.policy.cache_pythia import PythiaCache
from clairvoyant.profiler import core as profiler
from clairvoyant.profiler.core.confidence import ConfidenceConfig
from clairvoyant.profiler.core.sys_annotations import sys_annotations

TENANT, TYPE, MODEL = "acme", "shape", "m"
SYSTEM_BLOCKS, NEW_BLOCKS, OUTPUT_BLOCKS = 3, 2, 2


@dataclass(frozen=True)
class Step:
    """One call: ``agent``, continuing the call at index ``continues`` (its prompt + response come
    first) or, with None, starting from the agent's own system prompt."""

    agent: str
    continues: int | None = None


CHAIN = (Step("planner"), Step("coder", 0), Step("reviewer", 1))
LOOP = (Step("planner"), Step("coder", 0), Step("tester"), Step("coder", 1), Step("tester"), Step("summary"))
FAN_OUT = (Step("planner"), Step("worker", 0), Step("worker", 0), Step("worker", 0), Step("merger"))
REWORK = (Step("coder"), Step("reviewer", 0), Step("coder", 1), Step("reviewer", 2), Step("release"))


def ids(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(1000, 50_000) for _ in range(blocks * BLOCK_TOKENS)]


@dataclass
class Instance:
    """One workflow instance's prompts and outputs, built from its steps."""

    workflow_id: str
    steps: Sequence[Step]
    seed: int
    prompts: list[list[int]] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    new_parts: list[int] = field(default_factory=list)  # tokens at the end of each prompt seen nowhere before

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        for step in self.steps:
            if step.continues is None:
                head = ids(random.Random(f"system/{step.agent}"), SYSTEM_BLOCKS)
            else:
                head = self.prompts[step.continues] + self.outputs[step.continues]
            new = ids(rng, NEW_BLOCKS)
            self.prompts.append(head + new)
            self.outputs.append(ids(rng, OUTPUT_BLOCKS))
            self.new_parts.append(len(new))


def trained_store(steps: Sequence[Step], instances: int = 4) -> profiler.ProfileStore:
    store = profiler.ProfileStore(
        profiler.ProfileConfig(
            resynthesize_every=1,
            tables_every=1,
            confidence=ConfidenceConfig(min_instances=2, require_convergence=False),
        )
    )
    t = 0.0
    for i in range(instances):
        instance = Instance(f"train-{i}", steps, seed=i)
        for n, step in enumerate(steps):
            prompt_blocks, response_blocks = sequence_hashes(instance.prompts[n], instance.outputs[n])
            store.ingest(TENANT, TYPE, profiler.CallRecord(
                request_id=f"train-{i}-{n}", workflow_id=instance.workflow_id, agent_id=step.agent,
                start=t, end=t + 1.0, prompt_tokens=len(instance.prompts[n]),
                output_tokens=len(instance.outputs[n]), workflow_end=n == len(steps) - 1,
                prompt_blocks=tuple(prompt_blocks), response_blocks=tuple(response_blocks),
            ))  # fmt: skip
            t += 2.0
    return store


@dataclass
class Cluster:
    """The cache manager's core with ``pythia``, and what one busy worker (w1, where every call
    runs) and one idle one (w2) report."""

    core: CacheManagerCore = field(default_factory=lambda: CacheManagerCore(PythiaCache(), policy_name="pythia"))
    stored: set[int] = field(default_factory=set)
    sequence: int = 0

    def __post_init__(self) -> None:
        self.core.on_worker_load(WorkerLoad("w1", MODEL, running=1, l1_used=50, l1_total=100, l2_total=200, has_l3=True), 0.0)
        self.core.on_worker_load(WorkerLoad("w2", MODEL, l1_used=0, l1_total=100, l2_total=200, has_l3=True), 0.0)

    def serve(self, instance: Instance, n: int, annotations: SysAnnotations, now: float) -> list[CacheDirective]:
        """Call ``n`` ran on w1: its new blocks are stored there (lineage: that call), then its
        completion record arrives."""
        step = instance.steps[n]
        prompt_blocks, response_blocks = sequence_hashes(instance.prompts[n], instance.outputs[n])
        events = []
        for hashes, response in ((prompt_blocks, False), (response_blocks, True)):
            fresh = tuple(h for h in hashes if h not in self.stored)
            self.stored.update(fresh)
            if fresh:
                events.append(KvBlockEvent(
                    KvEventKind.STORED, KvTier.L1, TENANT, fresh, workflow_id=instance.workflow_id,
                    agent_id=step.agent, request_id=f"{instance.workflow_id}-{n}", response=response,
                ))  # fmt: skip
        self.sequence += 1
        self.core.on_kv_batch(KvBatch("w1", MODEL, BLOCK_TOKENS, self.sequence, tuple(events)), now)
        meta = AppMetadata(TYPE, instance.workflow_id, step.agent, workflow_end=n == len(instance.steps) - 1 or None)
        return self.core.on_completion(CompletedCall(
            f"{instance.workflow_id}-{n}", TENANT, MODEL, "w1", now - 1.0, now,
            prompt_tokens=len(instance.prompts[n]), output_tokens=len(instance.outputs[n]),
            app_metadata=meta, annotations=annotations,
            prompt_block_hashes=tuple(prompt_blocks), response_block_hashes=tuple(response_blocks),
            prompt_token_ids=tuple(instance.prompts[n]), output_token_ids=tuple(instance.outputs[n]),
        ), now)  # fmt: skip


def replay(steps: Sequence[Step], store: profiler.ProfileStore, instance: Instance | None = None):  # type: ignore[no-untyped-def]
    """Serve a fresh instance of ``steps``; yields (call index, its annotations, the directives)."""
    instance = instance or Instance("live", steps, seed=99)
    cluster = Cluster()
    for n, step in enumerate(instance.steps):
        annotations = sys_annotations(store.annotate(TENANT, TYPE, step.agent, workflow_id=instance.workflow_id))
        prompt_blocks, response_blocks = sequence_hashes(instance.prompts[n], instance.outputs[n])
        store.ingest(TENANT, TYPE, profiler.CallRecord(
            request_id=f"live-{n}", workflow_id=instance.workflow_id, agent_id=step.agent, start=100.0 + 2 * n,
            end=101.0 + 2 * n, prompt_tokens=len(instance.prompts[n]), output_tokens=len(instance.outputs[n]),
            workflow_end=n == len(instance.steps) - 1,
            prompt_blocks=tuple(prompt_blocks), response_blocks=tuple(response_blocks),
        ))  # fmt: skip
        yield n, annotations, cluster.serve(instance, n, annotations, 101.0 + 2 * n), cluster, instance


def hashes_of(directives: list[CacheDirective], kind: str) -> set[int]:
    return {h for d in directives if d.kind == kind for h in d.block_hashes}


def blocks_of(instance: Instance, *calls: int) -> set[int]:
    """Every block in the chains (prompt + response) of the given calls."""
    found: set[int] = set()
    for n in calls:
        prompt, response = sequence_hashes(instance.prompts[n], instance.outputs[n])
        found.update(prompt, response)
    return found


@pytest.mark.parametrize("steps", [CHAIN, LOOP, FAN_OUT, REWORK], ids=["chain", "loop", "fan_out", "rework"])
def test_the_staged_prompt_is_the_next_prompt_up_to_its_new_part(steps: Sequence[Step]) -> None:
    store = trained_store(steps)
    staged = 0
    for n, served_with, directives, _, instance in replay(steps, store):
        assert served_with.confidence.name in ("LOW", "HIGH")
        speculative = [d for d in directives if d.speculative]
        assert all(d.kind == "promote" and d.target_tier == 2 or d.kind == "pre_prefill" for d in speculative)
        for stage in speculative:  # the profile's template for the predicted agent, filled from history
            assert n + 1 < len(steps) and stage.agent_id == steps[n + 1].agent == served_with.next_agents[0].agent_id
            following = instance.prompts[n + 1]
            expected = len(following) - instance.new_parts[n + 1]
            assert list(stage.token_ids) == following[:expected], f"call {n + 1}"
            assert (stage.kind, stage.worker_id) == ("promote", "w2")  # the roomier worker, in L2
            staged += 1
    assert staged >= 1


def test_a_chain_drops_nothing_a_later_call_continues_and_everything_at_its_end() -> None:
    store = trained_store(CHAIN)
    seen = {n: directives for n, _, directives, _, _ in replay(CHAIN, store)}
    instance = Instance("live", CHAIN, seed=99)
    # The planner's blocks sit at the head of the coder's and the reviewer's prompts: never dead.
    assert hashes_of(seen[0], "drop") == set() and hashes_of(seen[1], "drop") == set()
    assert blocks_of(instance, 0) <= hashes_of(seen[1], "write_back")
    assert blocks_of(instance, 0) <= hashes_of(seen[1], "write_back")
    # The reviewer ends the workflow: every block only it held goes (the system prompts are shared
    # with no live workflow and are not yet a static prefix: one live instance).
    assert hashes_of(seen[2], "drop") == blocks_of(instance, 0, 1, 2)


def test_a_loop_drops_the_testers_blocks_and_keeps_the_coders_conversation() -> None:
    store = trained_store(LOOP)
    seen = {n: directives for n, _, directives, _, _ in replay(LOOP, store)}
    instance = Instance("live", LOOP, seed=99)
    # After the last tester, only the summary is left, and its prompt starts from its own system
    # prompt: the coder's conversation and both testers' calls are dead.
    dead = hashes_of(seen[4], "drop")
    assert blocks_of(instance, 2, 4) - blocks_of(instance, 0, 1, 3) <= dead
    # After the first coder call the coder runs again and continues itself: its chain is kept.
    assert blocks_of(instance, 1) <= hashes_of(seen[1], "write_back")
    assert hashes_of(seen[1], "drop") & blocks_of(instance, 1) == set()


def test_a_fan_out_keeps_the_planner_for_every_worker_then_drops_it() -> None:
    store = trained_store(FAN_OUT)
    seen = {n: directives for n, _, directives, _, _ in replay(FAN_OUT, store)}
    instance = Instance("live", FAN_OUT, seed=99)
    planner = blocks_of(instance, 0)
    for n in (0, 1, 2):  # workers still to come copy the planner
        assert hashes_of(seen[n], "drop") & planner == set(), n
    assert planner <= hashes_of(seen[1], "write_back")
    # After the last worker the merger (own system prompt) is all that is left.
    assert planner <= hashes_of(seen[3], "drop")


def test_rework_keeps_the_coders_thread_while_a_review_can_send_it_back() -> None:
    store = trained_store(REWORK)
    seen = {n: directives for n, _, directives, _, _ in replay(REWORK, store)}
    instance = Instance("live", REWORK, seed=99)
    thread = blocks_of(instance, 0, 1, 2)
    for n in (0, 1, 2):
        assert hashes_of(seen[n], "drop") & thread == set(), n
    assert thread <= hashes_of(seen[3], "drop")  # the release starts from its own system prompt


def test_a_wrong_prediction_costs_only_l2_space() -> None:
    """Trained on planner -> coder, the live instance goes planner -> auditor (never seen): the
    staged coder prompt sat in w2's L2 only, nothing was pinned in device memory for it and nothing
    was dropped; every staged token ends up counted as used or wasted."""
    store = trained_store(CHAIN)
    wrong = Instance("live", (Step("planner"), Step("auditor", 0), Step("reviewer", 1)), seed=99)
    served = replay(wrong.steps, store, wrong)
    _, annotations, directives, cluster, _ = next(served)
    assert annotations.next_agents[0].agent_id == "coder"  # the prediction, wrong this time
    speculative = [d for d in directives if d.speculative]
    assert [(d.kind, d.target_tier, d.worker_id) for d in speculative] == [("promote", 2, "w2")]
    assert not any(d.kind == "retain" and d.target_tier == 1 and d.agent_id == "coder" for d in directives)
    assert hashes_of(directives, "drop") == set()  # nothing anyone may need is dropped on a guess
    staged = len(speculative[0].token_ids)
    assert cluster.core.stats().speculative_tokens == staged
    for _ in served:  # the auditor then continues the planner, as the coder would have
        pass
    stats = cluster.core.stats()
    # The staged prefix was the planner's context, which the auditor's prompt starts with: used.
    assert stats.speculative_used_tokens >= staged - BLOCK_TOKENS
    assert stats.speculative_used_tokens + stats.speculative_wasted_tokens == stats.speculative_tokens


def test_staged_tokens_nobody_reads_are_counted_as_wasted() -> None:
    store = trained_store(CHAIN)
    wrong = Instance("live", (Step("planner"), Step("auditor"), Step("reviewer", 1)), seed=99)
    served = list(replay(wrong.steps, store, wrong))
    staged = sum(len(d.token_ids) for _, _, directives, _, _ in served for d in directives if d.speculative)
    stats = served[-1][3].core.stats()
    assert staged > 0 and stats.speculative_tokens == staged
    # The auditor starts from its own system prompt: the planner's context staged for the coder
    # was never read, and the workflow's end settles it as waste.
    assert (stats.speculative_used_tokens, stats.speculative_wasted_tokens) == (0, staged)
