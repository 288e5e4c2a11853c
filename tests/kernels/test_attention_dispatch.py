"""The torch runner's decode path through the Triton kernel gives the logits of its SDPA path.

On a CUDA device ``build_paged_context`` hands decode items to the kernel; here the switch is forced
on CPU (the kernel then runs in the interpreter) so the wiring (rows, block tables, seq_lens) is
checked on every machine.
"""

from __future__ import annotations

import pytest
import torch

from clairvoyant.worker.models import attention
from clairvoyant.worker.models.config import ModelConfig
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo
from clairvoyant.worker.runners.tiny_random import TINY_SPECIAL_TOKENS, random_model
from clairvoyant.worker.runners.tokenizer import ByteTokenizer
from clairvoyant.worker.runners.torch_runner import TorchRunner

pytestmark = pytest.mark.unit

BLOCK_SIZE = 4
# Two layers, GQA (4 query heads share 2 KV heads): every interpreted kernel program costs time.
CONFIG = ModelConfig(
    vocab_size=260, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    max_position_embeddings=128,
)  # fmt: skip


def step_items() -> tuple[list[ForwardItem], list[ForwardItem]]:
    """Prefills of three sequences, then one mixed step: two decodes around a prefill chunk."""
    prompts = {0: list(range(40, 49)), 1: list(range(60, 64)), 2: list(range(80, 95))}  # 9, 4, 15 tokens
    tables = {0: [7, 2, 9], 1: [4, 11], 2: [1, 5, 0, 8, 10]}  # scrambled blocks, the last ones partial
    prefill = [ForwardItem(seq, prompt, 0, tables[seq], want_logits=True) for seq, prompt in prompts.items()]
    mixed = [
        ForwardItem(0, [101], 9, tables[0], want_logits=True),  # decode at position 9 (block 9, offset 1)
        ForwardItem(2, [102, 103], 15, tables[2], want_logits=True),  # a 2-token chunk: stays on SDPA
        ForwardItem(1, [104], 4, tables[1], want_logits=True),  # decode at position 4 (a new block)
    ]
    return prefill, mixed


def run(kernel: bool, device: torch.device, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, list]:
    info = ModelInfo(
        "test", CONFIG.vocab_size, 128, (257,), CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.head_dim
    )
    runner = TorchRunner(
        random_model(CONFIG, seed=1, device=str(device)), ByteTokenizer(TINY_SPECIAL_TOKENS), info
    )
    runner.allocate_kv(12, BLOCK_SIZE)
    prefill, mixed = step_items()
    runner.forward(prefill)
    monkeypatch.setattr(attention, "triton_decode_available", lambda _device: kernel)
    context, _ = attention.build_paged_context(mixed, runner.kv_cache, BLOCK_SIZE)  # type: ignore[arg-type]
    return runner.forward(mixed), [context.decodes, context.kernel_decodes]


def test_kernel_decode_path_gives_the_sdpa_logits(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected, (sdpa_batch, none) = run(False, device, monkeypatch)
    got, (no_batch, kernel_batch) = run(True, device, monkeypatch)
    assert sdpa_batch is not None and none is None and no_batch is None  # each path really was taken
    assert kernel_batch.rows.tolist() == [0, 3]
    assert kernel_batch.seq_lens.tolist() == [10, 5]
    assert kernel_batch.block_tables.tolist() == [[7, 2, 9], [4, 11, 0]]
    assert got.shape == (3, expected.shape[1])
    torch.testing.assert_close(got.cpu(), expected.cpu(), atol=1e-4, rtol=1e-4)
    assert got.argmax(dim=-1).tolist() == expected.argmax(dim=-1).tolist()


def test_cpu_keeps_the_sdpa_path() -> None:
    assert not attention.triton_decode_available(torch.device("cpu"))
