"""The paged forward (chunked prefill, decode, mixed batches, shared prefixes) equals an uncached reference."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from clairvoyant.worker.models.config import Llama3RopeScaling, ModelConfig
from clairvoyant.worker.models.llama import reference_logits
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo, ModelRunner
from clairvoyant.worker.runners.tiny_random import TINY_SPECIAL_TOKENS, load_tiny_random, random_model
from clairvoyant.worker.runners.tokenizer import ByteTokenizer
from clairvoyant.worker.runners.torch_runner import TorchRunner


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models: more threads only add contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


pytestmark = pytest.mark.unit

ATOL = 1e-4
BLOCK_SIZE = 4
NUM_BLOCKS = 48

# Qwen2-style: q/k/v biases, tied embeddings, large rope_theta; and a Llama-3.1-style scaled RoPE.
QWEN2_STYLE = ModelConfig(
    vocab_size=260, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
    max_position_embeddings=512, rope_theta=1_000_000.0, tie_word_embeddings=True, qkv_bias=True,
)  # fmt: skip
LLAMA3_STYLE = ModelConfig(
    vocab_size=260, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=8, num_kv_heads=2,
    max_position_embeddings=512, rope_theta=500_000.0, o_proj_bias=True, qkv_bias=True,
    rope_scaling=Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                   original_max_position_embeddings=64),
)  # fmt: skip


def runner_for(config: ModelConfig | None) -> TorchRunner:
    if config is None:
        runner = load_tiny_random()
    else:
        info = ModelInfo(
            "test", config.vocab_size, 512, (257,), config.num_layers, config.num_kv_heads, config.head_dim
        )
        runner = TorchRunner(random_model(config, seed=1), ByteTokenizer(TINY_SPECIAL_TOKENS), info)
    runner.allocate_kv(NUM_BLOCKS, BLOCK_SIZE)
    return runner


CONFIGS = pytest.mark.parametrize(
    "config", [None, QWEN2_STYLE, LLAMA3_STYLE], ids=["tiny-random", "qwen2", "llama3"]
)


def shuffled_blocks(count: int, seed: int, exclude: tuple[int, ...] = ()) -> list[int]:
    """``count`` distinct physical blocks in a scrambled order, so no position maps to its own index."""
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(seed)).tolist()
    return [b for b in order if b not in exclude][:count]


def random_tokens(count: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@CONFIGS
def test_chunked_prefill_and_decode_match_reference(config: ModelConfig | None) -> None:
    runner = runner_for(config)
    prompt = random_tokens(37, seed=3)
    table = shuffled_blocks(-(-(37 + 6) // BLOCK_SIZE), seed=4)
    seq = list(prompt)
    got: dict[int, torch.Tensor] = {}  # position -> logits row returned for it
    for start, end in ((0, 13), (13, 29), (29, 37)):  # chunk edges fall mid-block on purpose
        out = runner.forward([ForwardItem(0, seq[start:end], start, table, want_logits=True)])
        assert out.shape == (1, runner.info.vocab_size) and out.dtype == torch.float32
        got[end - 1] = out[0]
    for _ in range(6):
        seq.append(int(got[len(seq) - 1].argmax()))
        got[len(seq) - 1] = runner.forward(
            [ForwardItem(0, [seq[-1]], len(seq) - 1, table, want_logits=True)]
        )[0]
    reference = reference_logits(runner.model, seq)
    for position, row in got.items():
        torch.testing.assert_close(row, reference[position], atol=ATOL, rtol=0)
    # K/V landed exactly in the slots base.py's formula names, and nowhere else.
    written = {table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(len(seq))}
    assert runner.kv_cache is not None
    filled = runner.kv_cache.abs().sum(dim=(0, 1, 3, 4)) > 0
    assert set(torch.nonzero(filled).flatten().tolist()) == written
    # Greedy continuations differ by prompt, so the weights are not degenerate.
    assert len({int(reference[p].argmax()) for p in got}) > 1


@CONFIGS
def test_mixed_batch_of_two_sequences_matches_reference(config: ModelConfig | None) -> None:
    runner = runner_for(config)
    a, b = random_tokens(11, seed=5), random_tokens(23, seed=6)
    table_a = shuffled_blocks(6, seed=7)
    table_b = shuffled_blocks(9, seed=8, exclude=tuple(table_a))
    # Step 1: A's whole prefill.  Step 2: A decodes beside B's first chunk (which wants no logits).
    first = runner.forward([ForwardItem(1, a, 0, table_a, want_logits=True)])
    a.append(int(first[0].argmax()))
    out = runner.forward(
        [
            ForwardItem(1, a[-1:], len(a) - 1, table_a, True),
            ForwardItem(2, b[:10], 0, table_b, want_logits=False),
        ]
    )
    assert out.shape[0] == 1
    rows_a = {len(a) - 2: first[0], len(a) - 1: out[0]}
    rows_b: dict[int, torch.Tensor] = {}
    # Step 3: B's last chunk listed first, A's decode second: rows come back in item order.
    a.append(int(out[0].argmax()))
    out = runner.forward(
        [ForwardItem(2, b[10:], 10, table_b, True), ForwardItem(1, a[-1:], len(a) - 1, table_a, True)]
    )
    rows_b[len(b) - 1], rows_a[len(a) - 1] = out[0], out[1]
    for _ in range(4):  # then both decode together
        a.append(int(rows_a[len(a) - 1].argmax()))
        b.append(int(rows_b[len(b) - 1].argmax()))
        out = runner.forward(
            [
                ForwardItem(1, a[-1:], len(a) - 1, table_a, True),
                ForwardItem(2, b[-1:], len(b) - 1, table_b, True),
            ]
        )
        rows_a[len(a) - 1], rows_b[len(b) - 1] = out[0], out[1]
    for tokens, rows in ((a, rows_a), (b, rows_b)):
        reference = reference_logits(runner.model, tokens)
        for position, row in rows.items():
            torch.testing.assert_close(row, reference[position], atol=ATOL, rtol=0)


@CONFIGS
def test_shared_prefix_blocks_are_read_not_recomputed(config: ModelConfig | None) -> None:
    """A second sequence reusing the first's full prefix blocks (prefix cache) prefills only its suffix."""
    runner = runner_for(config)
    prefix = random_tokens(12, seed=9)  # exactly 3 blocks
    table_a = shuffled_blocks(5, seed=10)
    runner.forward([ForwardItem(1, prefix + random_tokens(5, seed=11), 0, table_a, want_logits=True)])
    suffix = random_tokens(7, seed=12)
    table_b = table_a[:3] + shuffled_blocks(2, seed=13, exclude=tuple(table_a))
    out = runner.forward([ForwardItem(2, suffix, 12, table_b, want_logits=True)])
    torch.testing.assert_close(out[0], reference_logits(runner.model, prefix + suffix)[-1], atol=ATOL, rtol=0)


def test_runner_contract_details() -> None:
    runner = load_tiny_random()
    assert isinstance(runner, ModelRunner)
    config = runner.model.config
    assert (
        runner.kv_bytes_per_token()
        == config.num_layers * 2 * config.num_kv_heads * config.head_dim * 4
        == 4096
    )
    with pytest.raises(RuntimeError, match="allocate_kv"):
        runner.forward([ForwardItem(0, [1], 0, [0], True)])
    runner.allocate_kv(num_blocks=3, block_size=16)
    assert runner.kv_cache is not None and runner.kv_cache.shape == (4, 2, 48, 2, 64)
    assert runner.forward([]).shape == (0, 260)
    assert runner.forward([ForwardItem(0, [1, 2, 3], 0, [0], want_logits=False)]).shape == (0, 260)
    with pytest.raises(ValueError, match="block table"):  # 20 positions need 2 blocks of 16
        runner.forward([ForwardItem(0, list(range(20)), 0, [0], True)])
