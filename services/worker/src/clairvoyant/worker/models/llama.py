"""A Llama-style decoder (Llama 2/3, SmolLM, Qwen2) over paged KV.

Module and parameter names mirror transformers' ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj``
...), so a Hugging Face state dict loads as is and the GGUF loader only has to rename tensors to them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from clairvoyant.worker.models.attention import PagedContext, causal_attention, paged_attention
from clairvoyant.worker.models.config import Llama3RopeScaling, ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the model dtype, as the reference implementations do.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if config.rope_scaling is not None:
        inv_freq = _llama3_scale(inv_freq, config.rope_scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, and the band between is interpolated.
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Half-split ("rotate_half") RoPE with cos/sin tabulated once for every position."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, rope_inverse_frequencies(config))
        angles = torch.cat((freqs, freqs), dim=-1)  # [max_pos, head_dim]
        # Not persistent: derived from the config, so never part of a checkpoint.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ([T, heads, head_dim]) by the angles of ``positions`` ([T])."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden, q_size = config.hidden_size, config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.q_proj = nn.Linear(hidden, q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.o_proj_bias)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, context: PagedContext | None
    ) -> torch.Tensor:
        rows = x.shape[0]
        q = rope(self.q_proj(x).view(rows, self.num_heads, self.head_dim), positions)
        k = rope(self.k_proj(x).view(rows, self.num_kv_heads, self.head_dim), positions)
        v = self.v_proj(x).view(rows, self.num_kv_heads, self.head_dim)
        if context is None:
            out = causal_attention(q, k, v, self.scale)
        else:
            out = paged_attention(q, k, v, self.layer, context, self.scale)
        return self.o_proj(out.reshape(rows, self.num_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = SwiGLU(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, context: PagedContext | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, context)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)


class LlamaForCausalLM(nn.Module):
    """``forward`` returns final hidden states; ``compute_logits`` projects only the rows asked for."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        # Tied checkpoints carry no lm_head; the embedding matrix doubles as the output projection.
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, context: PagedContext | None
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the flattened rows; ``context=None`` means one uncached sequence."""
        if positions.numel() and int(positions.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(positions.max())} exceeds the model's {self.config.max_position_embeddings}"
            )
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions, self.model.rotary, context)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)


@torch.inference_mode()
def reference_logits(model: LlamaForCausalLM, token_ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] of one whole sequence with plain causal attention and no KV cache (for tests)."""
    device = model.model.embed_tokens.weight.device
    ids = torch.tensor(token_ids, dtype=torch.int64, device=device)
    positions = torch.arange(len(token_ids), device=device)
    return model.compute_logits(model(ids, positions, None)).float()


def build_from_state_dict(
    config: ModelConfig, state_dict: dict[str, torch.Tensor], device: str | torch.device, dtype: torch.dtype
) -> LlamaForCausalLM:
    """A model holding ``state_dict`` (transformers names), without paying for a random init first.

    Raises ``RuntimeError`` listing missing or unexpected tensors, so a bad name mapping fails loudly.
    """
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    weights = {
        name: tensor.to(device=device, dtype=dtype)
        for name, tensor in state_dict.items()
        # Tied checkpoints may still store lm_head; old ones store RoPE frequencies we derive ourselves.
        if not (config.tie_word_embeddings and name == "lm_head.weight")
        and not name.endswith("rotary_emb.inv_freq")
    }
    model.load_state_dict(weights, strict=True, assign=True)
    # Buffers are not in the state dict, so the meta-device RoPE tables are rebuilt for real.
    model.model.rotary = RotaryEmbedding(config).to(device)
    return model
