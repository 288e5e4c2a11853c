"""The emulated runner inside the real engine core: exact step times, unchanged scheduling and caching."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from clairvoyant.worker.app import RUNNERS, engine_config
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.costmodel.roofline import BatchItem
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo, ModelRunner, SizesOwnKvPool, Tokenizer
from clairvoyant.worker.runners.emulated import PLACEHOLDER_TOKEN, EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner
from tests.worker.fakes import drain, letters, request

pytestmark = pytest.mark.unit


class VirtualClock:
    """The simulator's use: ``sleep`` advances virtual time instead of waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Recording:
    """A ``ModelRunner`` wrapper that records every batch the engine hands over."""

    def __init__(self, inner: ModelRunner) -> None:
        self.inner = inner
        self.info: ModelInfo = inner.info
        self.tokenizer: Tokenizer = inner.tokenizer
        self.batches: list[list[tuple[int, int, int, bool, tuple[int, ...]]]] = []

    def kv_bytes_per_token(self) -> int:
        return self.inner.kv_bytes_per_token()

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        self.inner.allocate_kv(num_blocks, block_size)

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        self.batches.append(
            [(i.seq_id, len(i.token_ids), i.start_pos, i.want_logits, tuple(i.block_table)) for i in items]
        )
        return self.inner.forward(items)


def emulated_engine(**config: int | bool) -> tuple[LLMEngine, EmulatedRunner, VirtualClock]:
    clock = VirtualClock()
    runner = EmulatedRunner("llama-3.1-8b", "H100-80G", sleep=clock.sleep)
    return LLMEngine(runner, EngineConfig(**config), clock), runner, clock  # type: ignore[arg-type]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_every_request_gets_exactly_max_tokens_placeholders(temperature: float) -> None:
    engine, _, _ = emulated_engine(block_size=16, num_blocks=256, max_num_seqs=4)
    lengths = {f"r{i}": 1 + 7 * i for i in range(6)}
    for rid, max_tokens in lengths.items():
        engine.add_request(request(rid, letters(30 + len(rid), seed=len(rid)), max_tokens, temperature, seed=1))
    results = drain(engine)
    for rid, max_tokens in lengths.items():
        assert results[rid].token_ids == [PLACEHOLDER_TOKEN] * max_tokens
        assert results[rid].text == "x" * max_tokens
        assert results[rid].final.finish_reason == "length"


def test_each_step_sleeps_what_the_cost_model_predicts_for_its_batch() -> None:
    engine, runner, clock = emulated_engine(block_size=16, num_blocks=64, max_num_batched_tokens=64)
    engine.add_request(request("a", letters(100, seed=1), max_tokens=5))
    results = drain(engine)
    cost = runner.cost
    expected = [
        cost.step_cost([BatchItem(64, 0)]).seconds,  # chunked prefill: 64 + 36
        cost.step_cost([BatchItem(36, 64)]).seconds,
        *(cost.step_cost([BatchItem(1, 100 + k)]).seconds for k in range(4)),  # 4 decodes after token 1
    ]
    assert clock.sleeps == expected
    assert runner.steps == 6 and runner.busy_seconds == pytest.approx(sum(expected))
    assert runner.last_step_seconds == expected[-1] and runner.last_step is not None
    assert not runner.last_step.compute_bound
    # In virtual time the engine's clock is the runner's: the first token lands after both chunks.
    assert results["a"].final.first_token_time == pytest.approx(expected[0] + expected[1])
    assert clock.now == pytest.approx(sum(expected))


def test_a_prefix_cache_hit_shortens_the_second_prefill() -> None:
    engine, runner, clock = emulated_engine(block_size=16, num_blocks=256, max_num_batched_tokens=2048)
    prompt = letters(2048, seed=3)
    engine.add_request(request("first", prompt, max_tokens=2))
    first = drain(engine)["first"]
    first_prefill = clock.sleeps[0]
    clock.sleeps.clear()
    engine.add_request(request("second", prompt, max_tokens=2))
    second = drain(engine)["second"]
    # The lookup stops a token short of the prompt: 127 of 128 blocks hit, 16 tokens recomputed.
    assert (first.final.cached_tokens, second.final.cached_tokens) == (0, 2032)
    assert first_prefill == runner.cost.step_cost([BatchItem(2048, 0)]).seconds
    assert clock.sleeps[0] == runner.cost.step_cost([BatchItem(16, 2032)]).seconds
    assert clock.sleeps[0] < first_prefill / 5
    assert engine.stats().cached_prompt_tokens_total == 2032


def test_scheduling_preemption_and_caching_match_the_torch_runner() -> None:
    config = EngineConfig(block_size=4, num_blocks=24, max_num_seqs=4, max_num_batched_tokens=32)
    torch_runner = Recording(load_runner("tiny-random", max_model_len=256))
    emulated = Recording(EmulatedRunner("llama-3.1-8b", "H100-80G", sleep=lambda _: None, max_model_len=256))
    stats = []
    for runner in (torch_runner, emulated):
        engine = LLMEngine(runner, config, lambda: 0.0)
        for i in range(5):
            engine.add_request(request(f"r{i}", letters(10 + 3 * i, seed=i), max_tokens=12, ignore_eos=True))
        results = drain(engine)  # check_integrity() after every step
        assert all(len(r.token_ids) == 12 for r in results.values())
        stats.append(engine.stats())
    assert stats[0].preemptions_total > 0, "the pool must be small enough to force preemption"
    assert emulated.batches == torch_runner.batches  # same chunks, positions and physical blocks, step by step
    assert stats[0] == stats[1]


def test_the_pool_is_sized_from_the_emulated_gpu_memory() -> None:
    settings = WorkerSettings(runner="emulated", model="llama-3.1-8b", gpu="H100-80G")
    runner = RUNNERS.create("emulated", settings=settings)
    assert isinstance(runner, EmulatedRunner) and isinstance(runner, SizesOwnKvPool)
    capacity = runner.cost.kv_capacity_tokens(0.9)
    assert engine_config(settings, runner).num_blocks == capacity // 16 == runner.default_num_blocks(16)
    assert engine_config(settings.model_copy(update={"num_blocks": 100}), runner).num_blocks == 100
    # The torch runner keeps sizing its pool from kv_cache_mb.
    tiny = load_runner("tiny-random")
    assert not isinstance(tiny, SizesOwnKvPool)
    assert engine_config(settings, tiny).num_blocks == 256 * 2**20 // (tiny.kv_bytes_per_token() * 16)


def test_registry_builds_the_configured_shape() -> None:
    assert RUNNERS.names() == ["emulated", "torch"]
    settings = WorkerSettings(runner="emulated", model="Qwen/Qwen2.5-7B-Instruct", gpu="a100-80g",
                              tensor_parallel=2, max_model_len=8192)
    runner = RUNNERS.create("emulated", settings=settings)
    assert isinstance(runner, EmulatedRunner)
    assert (runner.info.name, runner.info.max_model_len, runner.cost.tp) == ("qwen2.5-7b", 8192, 2)
    assert runner.cost.gpu.name == "A100-80G"
    assert runner.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2  # 2 of 4 KV heads per GPU
    with pytest.raises(ValueError, match="unknown runner"):
        RUNNERS.create("tensorrt", settings=settings)


def test_info_tokenizer_and_contract_errors() -> None:
    runner = EmulatedRunner()
    assert runner.info.name == "llama-3.1-8b" and runner.info.max_model_len == 131_072
    assert runner.info.vocab_size == 260 and PLACEHOLDER_TOKEN not in runner.info.eos_token_ids
    ids = runner.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert runner.tokenizer.decode(ids) == "user\nhi\nassistant\n" and max(ids) < 260
    assert runner.startup_seconds == runner.cost.startup_time()
    with pytest.raises(RuntimeError, match="allocate_kv"):
        runner.forward([ForwardItem(0, [1], 0, [0], True)])
    with pytest.raises(ValueError, match="positive"):
        runner.allocate_kv(0, 16)
    with pytest.raises(ValueError, match="does not fit"):
        EmulatedRunner("llama-3.1-70b", "H100-80G", 1)
    runner.allocate_kv(8, 16)
    logits = runner.forward([ForwardItem(0, [1, 2], 0, [0], False), ForwardItem(1, [3], 5, [1], True)])
    assert logits.shape == (1, 260) and int(logits[0].argmax()) == PLACEHOLDER_TOKEN


def test_a_live_runner_absorbs_host_time_up_to_the_modelled_step_overhead() -> None:
    clock = VirtualClock()
    runner = EmulatedRunner(sleep=clock.sleep, clock=clock, absorb_host_time=True)
    runner.allocate_kv(64, 16)
    item = ForwardItem(0, [1], 40, list(range(3)), True)
    step = runner.cost.step_cost([BatchItem(1, 40)]).seconds
    overhead = runner.cost.gpu.step_overhead
    assert step > 2 * overhead

    def forward_after(host_seconds: float) -> float:
        clock.sleep(host_seconds)  # the engine's own work between two forwards
        before = clock.now
        runner.forward([item])
        return clock.now - before

    assert forward_after(0.0) == pytest.approx(step)  # the first step has nothing to absorb
    assert forward_after(0.4 * overhead) == pytest.approx(step - 0.4 * overhead)  # step + host = step
    assert forward_after(5 * overhead) == pytest.approx(step - overhead)  # an idle gap: one overhead at most
    plain = EmulatedRunner(sleep=clock.sleep, clock=clock)
    plain.allocate_kv(64, 16)
    clock.sleep(0.4 * overhead)
    before = clock.now
    plain.forward([item])
    assert clock.now - before == pytest.approx(step)  # the simulator's runner sleeps the whole step


@pytest.mark.parametrize("distinct_tokens", [True, False])
def test_forward_tokens_are_what_any_sampler_draws_from_forward(distinct_tokens: bool) -> None:
    """The engine's fast path (``forward_tokens``) gives the tokens that sampling ``forward``'s
    logits gives, greedy or at any temperature, and costs the step the same."""
    from clairvoyant.worker.core.sampling import SampleRow, SamplingParams, make_generator, sample

    fast, slow = (EmulatedRunner(sleep=lambda s: None, distinct_tokens=distinct_tokens) for _ in range(2))
    for runner in (fast, slow):
        runner.allocate_kv(64, 16)
    items = [ForwardItem(seq_id, list(range(5 + seq_id)), 3 * seq_id, [seq_id], want_logits=seq_id % 3 != 1)
             for seq_id in range(9)]  # fmt: skip
    rows = [SampleRow(SamplingParams(temperature=0.0 if i % 2 else 0.9, top_p=0.5 if i % 4 == 0 else 1.0),
                      make_generator(i), ()) for i, item in enumerate(items) if item.want_logits]  # fmt: skip
    tokens = fast.forward_tokens(items)
    assert tokens == sample(slow.forward(items), rows)
    assert len(tokens) == 6 and (len(set(tokens)) > 1) == distinct_tokens
    assert (fast.steps, fast.busy_seconds) == (slow.steps, slow.busy_seconds) == (1, slow.last_step_seconds)
