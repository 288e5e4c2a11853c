"""Model architectures for the roofline cost model, from each checkpoint's public ``config.json``.

Only what the cost model needs: shapes (for parameter count, FLOPs and KV size) and the context
window.  Weights are bf16 (2 bytes per parameter) and so is the KV cache.

Formulas (``L`` layers, ``h`` hidden, ``H``/``H_kv`` query/KV heads, ``d`` head dim, ``I`` MLP
intermediate size, ``V`` vocabulary)::

    layer params   = h*(H*d) + 2*h*(H_kv*d) + (H*d)*h     attention q, k, v, o
                   + 3*h*I                                 SwiGLU gate, up, down
                   + 2*h                                   two RMSNorms
                   (+ H*d + 2*H_kv*d                       q/k/v biases, Qwen2)
    params         = L * layer params + V*h (embedding) + V*h (lm_head, unless tied) + h (final norm)
    FLOPs/token    = 2 * matmul params + 4 * L * (H*d) * context
                     (a multiply-add per weight; QK^T and PV each 2*(H*d) per key attended)
    KV bytes/token = 2 (K and V) * L * H_kv * d * 2 bytes
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_BYTES = 2


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_model_len: int  # native context window (no RoPE scaling beyond what the config enables)
    tie_embeddings: bool = False
    qkv_bias: bool = False

    @property
    def layer_params(self) -> int:
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * q_dim + 2 * self.hidden * kv_dim + q_dim * self.hidden
        bias = q_dim + 2 * kv_dim if self.qkv_bias else 0
        return attention + bias + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def head_params(self) -> int:
        """The lm_head projection (shared with the embedding when tied)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        embeddings = self.head_params * (1 if self.tie_embeddings else 2)
        return self.layers * self.layer_params + embeddings + self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.params * BF16_BYTES

    @property
    def streamed_weight_bytes(self) -> int:
        """Weights read from HBM by one forward pass: all layers and the lm_head.

        The embedding table is only gathered (a few rows per step), so an untied table is not read.
        """
        return (self.layers * self.layer_params + self.head_params + self.hidden) * BF16_BYTES

    def kv_bytes_per_token(self, kv_heads: int | None = None) -> int:
        """K and V of one token, all layers; ``kv_heads`` overrides the count (a tensor-parallel shard)."""
        heads = self.kv_heads if kv_heads is None else kv_heads
        return 2 * self.layers * heads * self.head_dim * BF16_BYTES

    def flops_per_token(self, context: int = 0) -> float:
        """Forward FLOPs of one token that attends over ``context`` keys (itself included)."""
        return 2.0 * (self.layers * self.layer_params + self.head_params) + self.attention_flops(context)

    def attention_flops(self, keys: int) -> float:
        """QK^T and PV FLOPs for ``keys`` (query, key) pairs, all heads and layers."""
        return 4.0 * self.layers * self.heads * self.head_dim * keys


# meta-llama/Llama-3.1-8B (config.json): 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336,
# vocab 128256, context 131072 (llama3 RoPE scaling built in).
LLAMA_31_8B = ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128_256, 131_072)
# meta-llama/Llama-3.1-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672.
LLAMA_31_70B = ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128_256, 131_072)
# Qwen/Qwen2.5-7B-Instruct: 28 layers, hidden 3584, 28 heads, 4 KV heads, MLP 18944, vocab 152064,
# q/k/v biases, untied head; 32768 native context (131072 only with YaRN switched on).
QWEN25_7B = ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152_064, 32_768, qkv_bias=True)
# Qwen/Qwen2.5-14B-Instruct: 48 layers, hidden 5120, 40 heads, 8 KV heads, MLP 13824.
QWEN25_14B = ModelSpec("qwen2.5-14b", 48, 5120, 40, 8, 128, 13824, 152_064, 32_768, qkv_bias=True)
# Qwen/Qwen2.5-32B-Instruct: 64 layers, hidden 5120, 40 heads, 8 KV heads, MLP 27648.
QWEN25_32B = ModelSpec("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152_064, 32_768, qkv_bias=True)
# Calibration only: the models NVIDIA's published TensorRT-LLM tables measured ("LLaMA 7B/70B").
# meta-llama/Llama-2-7b-hf: 32 layers, hidden 4096, 32 heads = 32 KV heads (no GQA), MLP 11008.
LLAMA_2_7B = ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32_000, 4096)
# meta-llama/Llama-2-70b-hf: 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672.
LLAMA_2_70B = ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32_000, 4096)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (LLAMA_31_8B, LLAMA_31_70B, QWEN25_7B, QWEN25_14B, QWEN25_32B, LLAMA_2_7B, LLAMA_2_70B)
}


def get_model(name: str) -> ModelSpec:
    """The spec named ``name`` (case-insensitive; a Hugging Face id's last part works too)."""
    key = name.lower().rsplit("/", 1)[-1].removeprefix("meta-").removesuffix("-hf").removesuffix("-instruct")
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}") from None
