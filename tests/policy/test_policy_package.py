"""The shared policy package: capability declarations checked at registration, presets naming one
policy per family, and the cache and scaling families' first members."""

from __future__ import annotations

import random

import pytest

from clairvoyant.policy import (
    CACHE_POLICIES,
    PRESETS,
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    SCALING_POLICIES,
    BlockUse,
    Capability,
    PolicyRegistry,
    Preset,
    ScalingInput,
    build_cache_policy,
    build_engine_rule,
    build_policies,
    build_scaling_policy,
    capabilities_of,
)
from clairvoyant.policy.autellix import KQueueRule
from clairvoyant.policy.capabilities import check_capabilities
from clairvoyant.policy.presets import PresetRegistry
from clairvoyant.policy.pythia import PythiaAgingRule
from clairvoyant.policy.scaling import ReplicaPhase, ReplicaState
from clairvoyant.worker.core.radix_cache import BlockTag, RadixCache

pytestmark = pytest.mark.unit


class Quiet:
    def priority(self, request: object, now: float) -> float:
        return 0.0


class Fixed(Quiet):
    capabilities = frozenset({Capability.FIXED_PRIORITY})

    def priority_is_fixed(self) -> bool:
        return True


def test_a_declared_hook_must_exist_and_an_existing_hook_must_be_declared() -> None:
    registry: PolicyRegistry[Quiet] = PolicyRegistry("test policy")
    registry.register("quiet")(Quiet)
    registry.register("fixed")(Fixed)

    class Missing(Quiet):
        capabilities = frozenset({Capability.ENGINE_RULE})

    class Hidden(Quiet):
        def priority_changes(self, now: float) -> object:
            return None

    with pytest.raises(TypeError, match="without their methods: engine_rule"):
        registry.register("missing")(Missing)
    with pytest.raises(TypeError, match="does not declare.*priority_changes"):
        registry.register("hidden")(Hidden)
    registry.register("built-later")(lambda: Hidden())  # a factory is checked when it first builds
    with pytest.raises(TypeError, match="priority_changes"):
        registry.create("built-later")
    assert registry.names() == ["built-later", "fixed", "quiet"]


@pytest.mark.parametrize("preset", PRESETS.names())
def test_every_registered_policy_declares_exactly_its_hooks(preset: str) -> None:
    priority, routing = build_policies(preset)
    for policy in (priority, routing):
        check_capabilities(type(policy))
        for capability in Capability:
            assert (capability in capabilities_of(policy)) == callable(
                getattr(policy, capability.value, None)
            )


def test_a_preset_names_one_member_of_each_family_and_must_name_registered_ones() -> None:
    names = PRESETS.create("pythia")
    assert names == Preset("pythia", "pythia-capacity", "pythia", "pythia")
    assert names.priority in PRIORITY_POLICIES and names.routing in ROUTING_POLICIES
    assert names.cache in CACHE_POLICIES and names.scaling in SCALING_POLICIES
    registry = PresetRegistry("preset")
    with pytest.raises(ValueError, match="unknown cache policy 'arc'"):
        registry.register_preset("bad", Preset("fcfs", "round-robin", cache="arc"))
    assert "bad" not in registry
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        build_policies("nope")


def test_engine_rules_come_from_the_priority_policy_that_declares_one() -> None:
    assert isinstance(build_engine_rule("autellix"), KQueueRule)
    assert isinstance(build_engine_rule("pythia"), PythiaAgingRule)
    assert build_engine_rule("fcfs-rr") is None and build_engine_rule("saga") is None
    assert build_engine_rule("autellix") is not build_engine_rule("autellix")  # one per engine


@pytest.mark.parametrize("seed", range(5))
def test_lru_ranks_blocks_in_the_order_the_engines_radix_cache_evicts_them(seed: int) -> None:
    """The cache family's ``lru`` member describes what every engine does today."""
    rng = random.Random(seed)
    cache, refs = RadixCache(block_size=1), {}
    for block in range(12):  # twelve one-block prompts, each released at once (evictable)
        cache.insert("t", None, [block], [block], [BlockTag(None, "prompt")])
        refs[block] = 1
        cache.note_unreferenced([block])
    for _ in range(20):  # later accesses reorder them
        block = rng.randrange(12)
        assert cache.match("t", [block], 1) == [block]
        cache.release([block], [2 if b == block else 1 for b in range(12)])
    ranks = {
        block: build_cache_policy("fcfs-rr").eviction_rank(BlockUse(block, node.last_access), now=0.0)
        for block, node in cache._node_of_block.items()  # noqa: SLF001 - what the policy would be told
    }
    by_rank = sorted(ranks, key=lambda block: (ranks[block], block))
    assert cache.evict(12, [1] * 12) == by_rank


def test_static_scaling_keeps_the_replicas_it_has() -> None:
    state = ScalingInput(
        replicas=(
            ReplicaState("r0", "llama-8b", 1, running=3),
            ReplicaState("r1", "llama-8b", 1, running=0),
            ReplicaState("r2", "qwen-32b", 2, running=5, phase=ReplicaPhase.DRAINING),
        ),
        queued={"llama-8b": 400},
        gpu_budget=8,
    )
    decision = build_scaling_policy("saga").tick(state, now=10.0)
    assert decision.targets == {"llama-8b": 2, "qwen-32b": 0}
    assert decision.drain == ()


def test_the_architecture_docs_worked_example_registers_and_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/architecture.md's "Adding a policy" code, run as written against fresh registries."""
    import re
    from pathlib import Path

    from clairvoyant.core.annotations import LengthInterval, SysAnnotations
    from clairvoyant.policy import presets as presets_module
    from clairvoyant.policy import scheduling
    from clairvoyant.policy.types import QueuedRequest, WorkerReport
    from clairvoyant.scheduler.core import GlobalScheduler

    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(# libs/policy/src/clairvoyant/policy/shortest.py\n.*?)```", doc, re.S)
    assert code is not None, "the worked example is gone from docs/architecture.md"
    priorities: PolicyRegistry[object] = PolicyRegistry("priority policy")
    for name in scheduling.PRIORITY_POLICIES.names():
        priorities.register(name)(scheduling.PRIORITY_POLICIES.factory(name))
    fresh_presets = PresetRegistry("preset")
    monkeypatch.setattr(scheduling, "PRIORITY_POLICIES", priorities)
    monkeypatch.setattr(presets_module, "PRIORITY_POLICIES", priorities)
    monkeypatch.setattr(presets_module, "PRESETS", fresh_presets)
    exec(compile(code.group(1), "architecture.md", "exec"), {})  # noqa: S102 - the doc's own code

    assert fresh_presets.create("shortest") == Preset("shortest-output", "least-loaded", "lru", "static")
    policy = priorities.create("shortest-output")
    sched = GlobalScheduler(policy, ROUTING_POLICIES.create("least-loaded"))
    sched.update_worker(WorkerReport("w0", "m", "w0:1", max_batch=1), 0.0)
    for rid, p50 in (("long", 900.0), ("none", None), ("short", 20.0)):
        ann = SysAnnotations(predicted_output_len=LengthInterval(p50, p50)) if p50 is not None else None
        sched.submit(QueuedRequest(rid, "t", "m", 0.0, annotations=ann), 0.0)
    order = []
    for now in (1.0, 2.0, 3.0):
        (placed,) = sched.dispatch(now)
        order.append(placed.request_id)
        sched.complete(placed.request_id, now=now)
    assert order == ["short", "long", "none"]
