"""``tiny-random``: a small Llama with seeded random weights and a byte tokenizer, for tests and the stack."""

from __future__ import annotations

import math

import torch

from clairvoyant.worker.models.config import ModelConfig
from clairvoyant.worker.models.llama import LlamaForCausalLM
from clairvoyant.worker.runners.base import ModelInfo
from clairvoyant.worker.runners.tokenizer import ByteTokenizer
from clairvoyant.worker.runners.torch_runner import TorchRunner

TINY_RANDOM_NAME = "tiny-random"
TINY_SPECIAL_TOKENS = ("<bos>", "<eos>", "<|im_start|>", "<|im_end|>")  # ids 256, 257, 258, 259
TINY_EOS_IDS = (257, 259)  # <eos>, and <|im_end|> which closes an assistant turn

TINY_RANDOM_CONFIG = ModelConfig(
    vocab_size=256 + len(TINY_SPECIAL_TOKENS),
    hidden_size=256,
    intermediate_size=512,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def init_random_weights(model: LlamaForCausalLM, seed: int = 0) -> None:
    """Fill ``model`` deterministically from ``seed``.

    Scales keep activations O(1) through the layers (std 1/sqrt(fan_in)) and make logits spread by a
    few units, so greedy decoding depends on the prompt instead of collapsing onto one token.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            # Drawn on CPU in float32 so every device and dtype gets the same numbers.
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            elif "embed_tokens" in name:
                value = noise
            elif name.startswith("lm_head"):
                value = noise * (3.0 / math.sqrt(param.shape[1]))
            else:
                value = noise / math.sqrt(param.shape[1])
            param.copy_(value.to(param.dtype))


def random_model(
    config: ModelConfig, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config)
    init_random_weights(model, seed)
    return model.to(device=device, dtype=dtype)


def load_tiny_random(
    device: str = "cpu", dtype: torch.dtype = torch.float32, max_model_len: int | None = None, seed: int = 0
) -> TorchRunner:
    config = TINY_RANDOM_CONFIG
    tokenizer = ByteTokenizer(TINY_SPECIAL_TOKENS)
    info = ModelInfo(
        name=TINY_RANDOM_NAME,
        vocab_size=config.vocab_size,
        max_model_len=min(config.max_position_embeddings, max_model_len or config.max_position_embeddings),
        eos_token_ids=TINY_EOS_IDS,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=str(dtype).removeprefix("torch."),
        extra={"source": "random", "seed": str(seed)},
    )
    return TorchRunner(random_model(config, seed, device, dtype), tokenizer, info)
