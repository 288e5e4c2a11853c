"""Load a llama.cpp GGUF file (llama or qwen2 architecture): hyperparameters, fp32 weights, tokenizer.

Every tensor is dequantised to float32 with ``gguf.quants.dequantize`` and renamed to transformers'
names; the vocabulary and merges become a byte-level BPE ``tokenizers.Tokenizer``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from clairvoyant.worker.models.config import ModelConfig
from clairvoyant.worker.models.llama import build_from_state_dict
from clairvoyant.worker.runners.base import ModelInfo
from clairvoyant.worker.runners.tokenizer import ChatTemplate, FastTokenizer, byte_level_bpe
from clairvoyant.worker.runners.torch_runner import TorchRunner

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
_MISSING = object()

# GGUF tensor name (after "blk.N.") -> transformers name (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _meta(reader: GGUFReader, key: str, default: Any = _MISSING) -> Any:
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def gguf_config(reader: GGUFReader) -> tuple[str, ModelConfig]:
    arch = str(_meta(reader, "general.architecture"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    if _meta(reader, f"{arch}.rope.scaling.type", "none") != "none":
        raise ValueError("GGUF RoPE scaling metadata is not supported")
    names = {tensor.name for tensor in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError("GGUF files with a rope_freqs tensor (Llama 3.1 scaling) are not supported yet")
    num_heads = int(_meta(reader, f"{arch}.attention.head_count"))
    hidden = int(_meta(reader, f"{arch}.embedding_length"))
    head_dim = int(_meta(reader, f"{arch}.attention.key_length", hidden // num_heads))
    vocab = _meta(reader, f"{arch}.vocab_size", None) or len(_meta(reader, "tokenizer.ggml.tokens"))
    config = ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(_meta(reader, f"{arch}.feed_forward_length")),
        num_layers=int(_meta(reader, f"{arch}.block_count")),
        num_heads=num_heads,
        num_kv_heads=int(_meta(reader, f"{arch}.attention.head_count_kv", num_heads)),
        max_position_embeddings=int(_meta(reader, f"{arch}.context_length")),
        head_dim_override=head_dim if head_dim != hidden // num_heads else None,
        rms_norm_eps=float(_meta(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_meta(reader, f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        o_proj_bias="blk.0.attn_output.bias" in names,
    )
    return arch, config


def _unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs back to transformers' halves).

    llama.cpp stores each head's rows as (pair, 2) interleaved: r0 r_half r1 r_half+1 ...; we need
    r0 r1 ... r_half ... again.  Same as transformers' ``_reverse_permute_weights``.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def gguf_state_dict(reader: GGUFReader, arch: str, config: ModelConfig) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        # GGUF lists dims fastest-first; numpy/torch order is the reverse.
        weight = torch.from_numpy(values.reshape(tuple(reversed([int(d) for d in tensor.shape]))).copy())
        match = _LAYER_NAME.fullmatch(tensor.name)
        if match:
            layer, kind, suffix = match.groups()
            if kind not in _LAYER_TENSORS:
                raise ValueError(f"unexpected GGUF tensor {tensor.name!r}")
            if arch == "llama" and kind in ("attn_q", "attn_k"):
                weight = _unpermute(weight, config.num_heads if kind == "attn_q" else config.num_kv_heads)
            state[f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.{suffix}"] = weight
            continue
        base, _, suffix = tensor.name.rpartition(".")
        if base not in _GLOBAL_TENSORS:
            raise ValueError(f"unexpected GGUF tensor {tensor.name!r}")
        state[f"{_GLOBAL_TENSORS[base]}.{suffix}"] = weight
    return state


def gguf_tokenizer(reader: GGUFReader) -> tuple[FastTokenizer, tuple[int, ...]]:
    """The byte-level BPE tokenizer the file describes, and its end-of-sequence ids."""
    model_kind = _meta(reader, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {model_kind!r} is not supported (only byte-level BPE, 'gpt2')")
    tokens: list[str] = list(_meta(reader, "tokenizer.ggml.tokens"))
    token_types: list[int] = list(_meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [str(m) for m in _meta(reader, "tokenizer.ggml.merges")]
    pre = str(_meta(reader, "tokenizer.ggml.pre", "gpt2"))
    backend = byte_level_bpe(tokens, merges, token_types, pre)
    special = {
        name: tokens[int(token_id)]
        for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"))
        if (token_id := _meta(reader, f"tokenizer.ggml.{key}", None)) is not None
    }
    source = _meta(reader, "tokenizer.chat_template", None)
    template = ChatTemplate(str(source), special) if source else None
    eos_ids = tuple(
        dict.fromkeys(
            int(token_id)
            for key in ("eos_token_id", "eot_token_id")
            if (token_id := _meta(reader, f"tokenizer.ggml.{key}", None)) is not None
        )
    )
    return FastTokenizer(backend, template), eos_ids


def load_gguf(
    path: str | Path,
    *,
    name: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_model_len: int | None = None,
) -> TorchRunner:
    path = Path(path)
    reader = GGUFReader(path)
    arch, config = gguf_config(reader)
    tokenizer, eos_ids = gguf_tokenizer(reader)
    model = build_from_state_dict(config, gguf_state_dict(reader, arch, config), device, dtype)
    info = ModelInfo(
        name=name or path.stem,
        vocab_size=config.vocab_size,
        max_model_len=min(config.max_position_embeddings, max_model_len or config.max_position_embeddings),
        eos_token_ids=eos_ids,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=str(dtype).removeprefix("torch."),
        extra={"source": "gguf", "path": str(path), "architecture": arch},
    )
    return TorchRunner(model, tokenizer, info)
