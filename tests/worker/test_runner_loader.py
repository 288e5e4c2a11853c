"""load_runner: named models, errors, and a Hugging Face checkpoint written by transformers itself."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from clairvoyant.worker.models.llama import reference_logits
from clairvoyant.worker.runners.hf_loader import CheckpointError
from clairvoyant.worker.runners.loader import load_runner, register_model, registered_names
from clairvoyant.worker.runners.torch_runner import greedy_generate


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models: more threads only add contention on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 after training
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention reads keys from blocks.",
    "héllo wörld",
]


@pytest.mark.unit
def test_unknown_model_lists_accepted_forms() -> None:
    with pytest.raises(ValueError, match="unknown model 'no-such-model'") as caught:
        load_runner("no-such-model")
    message = str(caught.value)
    for form in (
        "'tiny-random'",
        "'smollm2-135m-instruct'",
        "'HuggingFaceTB/SmolLM2-135M-Instruct'",
        ".gguf",
        "config.json",
    ):
        assert form in message
    assert registered_names() == [
        "tiny-random",
        "smollm2-135m-instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ]


@pytest.mark.unit
def test_missing_gguf_file_is_an_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="accepted"):
        load_runner(str(tmp_path / "absent.gguf"))


@pytest.mark.unit
def test_directory_without_config_json_says_so(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_runner(str(tmp_path))


@pytest.mark.unit
def test_names_register_once() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_model(("Tiny-Random",), lambda device, dtype, max_len: load_runner("tiny-random"))


@pytest.mark.unit
def test_tiny_random_by_name_is_deterministic_and_capped() -> None:
    first, second = load_runner("TINY-random", max_model_len=100), load_runner("tiny-random")
    assert (
        first.info.name == "tiny-random"
        and first.info.max_model_len == 100
        and second.info.max_model_len == 2048
    )
    assert (first.info.vocab_size, first.info.num_layers, first.info.num_kv_heads, first.info.head_dim) == (
        260,
        4,
        2,
        64,
    )
    assert first.info.eos_token_ids == (257, 259)
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)


def write_tokenizer(directory: Path) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer


COMMON: dict[str, Any] = dict(
    vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=None,
)  # fmt: skip
VARIANTS: dict[str, Callable[[Any], Any]] = {  # transformers module -> a fresh model
    # Untied, biases everywhere, head_dim decoupled from hidden/heads, Llama-3.1 RoPE scaling.
    "llama": lambda transformers: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **COMMON, head_dim=32, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        )
    ),
    # Tied embeddings, q/k/v biases only.
    "qwen2": lambda transformers: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**COMMON, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    ),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_hf_checkpoint_round_trip_matches_transformers(variant: str, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the round trip compares against transformers")
    reference = VARIANTS[variant](transformers).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # transformers zero-inits biases; random ones make the bias paths count
        for name, param in reference.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            param.copy_(base + 0.2 * torch.randn(param.shape, generator=generator))
    reference.save_pretrained(tmp_path, safe_serialization=True)
    hf_tokenizer = write_tokenizer(tmp_path)

    runner = load_runner(str(tmp_path), max_model_len=100)
    assert runner.info.name == tmp_path.name and runner.info.max_model_len == 100
    assert runner.info.eos_token_ids == (2,) and runner.info.vocab_size == 320
    assert runner.model.config.tie_word_embeddings == (variant == "qwen2")

    text = "The lazy fox reads blocks. héllo"
    assert runner.tokenizer.encode(text) == hf_tokenizer.encode(text).ids
    chat = [{"role": "user", "content": "quick dog"}]
    ids = runner.tokenizer.apply_chat_template(chat)
    assert ids[0] == 1 and ids[-3:] == hf_tokenizer.encode("assistant\n").ids[-3:]
    assert runner.tokenizer.decode(ids) == "user\nquick dog\nassistant\n"  # specials skipped

    with torch.no_grad():
        expected = reference(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(reference_logits(runner.model, ids), expected, atol=1e-4, rtol=0)
    runner.allocate_kv(num_blocks=8, block_size=4)
    # No EOS for HF either: both must produce exactly 8 greedy tokens.
    no_stop = transformers.GenerationConfig(
        max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    with torch.no_grad():
        hf_tokens = reference.generate(torch.tensor([ids]), generation_config=no_stop)[0, len(ids) :].tolist()
    assert greedy_generate(runner, ids, 8, prefill_chunk=5) == hf_tokens
