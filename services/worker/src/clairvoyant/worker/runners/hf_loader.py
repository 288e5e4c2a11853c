"""Load a local Hugging Face checkpoint directory (Llama or Qwen2): config.json, *.safetensors, tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors.torch import load_file

from clairvoyant.worker.models.config import Llama3RopeScaling, ModelConfig
from clairvoyant.worker.models.llama import build_from_state_dict
from clairvoyant.worker.runners.base import ModelInfo
from clairvoyant.worker.runners.tokenizer import ChatTemplate, FastTokenizer
from clairvoyant.worker.runners.torch_runner import TorchRunner

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


class CheckpointError(ValueError):
    """The directory is not a checkpoint this loader can read; the message says what is missing."""


def _read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def _rope(raw: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    # transformers 5 writes `rope_parameters`; older checkpoints use `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_parameters") or {})
    if not params:
        params = {"rope_theta": raw.get("rope_theta", 10000.0), **(raw.get("rope_scaling") or {})}
    rope_type = params.get("rope_type") or params.get("type") or "default"
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
        return theta, scaling
    raise CheckpointError(f"RoPE type {rope_type!r} is not supported (supported: default, llama3)")


def hf_config(raw: dict[str, Any]) -> ModelConfig:
    architectures = raw.get("architectures") or []
    if not set(architectures) & set(SUPPORTED_ARCHITECTURES):
        raise CheckpointError(
            f"architectures {architectures} not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    is_qwen2 = "Qwen2ForCausalLM" in architectures
    theta, scaling = _rope(raw)
    num_heads = int(raw["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        head_dim_override=raw.get("head_dim"),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v biases and none on o_proj; Llama's `attention_bias` covers all four.
        qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
        o_proj_bias=not is_qwen2 and bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
    )


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json spells special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return str(value.get("content"))
    return str(value) if value is not None else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def hf_tokenizer(directory: Path, raw_config: dict[str, Any]) -> tuple[FastTokenizer, tuple[int, ...]]:
    tokenizer_file = directory / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise CheckpointError(f"{directory} has no tokenizer.json")
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    tok_config = _read_json(directory / "tokenizer_config.json")
    special = {
        name: text
        for name in ("bos_token", "eos_token")
        if (text := _token_text(tok_config.get(name))) is not None
    }
    source = tok_config.get("chat_template")
    if isinstance(source, list):  # several named templates: serve the default one
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    jinja_file = directory / "chat_template.jinja"  # where transformers 5 saves it
    if source is None and jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    template = ChatTemplate(str(source), special) if source else None
    generation = _read_json(directory / "generation_config.json")
    eos = _ids(generation.get("eos_token_id")) + _ids(raw_config.get("eos_token_id"))
    if (
        not eos
        and "eos_token" in special
        and (token_id := backend.token_to_id(special["eos_token"])) is not None
    ):
        eos = [token_id]
    return FastTokenizer(backend, template), tuple(dict.fromkeys(eos))


def load_hf_dir(
    directory: str | Path,
    *,
    name: str | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_model_len: int | None = None,
) -> TorchRunner:
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory} is not a Hugging Face checkpoint: it has no config.json")
    raw = _read_json(config_file)
    config = hf_config(raw)
    weight_files = sorted(directory.glob("*.safetensors"))
    if not weight_files:
        raise CheckpointError(f"{directory} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for weight_file in weight_files:
        state.update(load_file(str(weight_file)))
    tokenizer, eos_ids = hf_tokenizer(directory, raw)
    model = build_from_state_dict(config, state, device, dtype)
    info = ModelInfo(
        name=name or directory.name,
        vocab_size=config.vocab_size,
        max_model_len=min(config.max_position_embeddings, max_model_len or config.max_position_embeddings),
        eos_token_ids=eos_ids,
        num_layers=config.num_layers,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        dtype=str(dtype).removeprefix("torch."),
        extra={
            "source": "hf",
            "path": str(directory),
            "architecture": ",".join(raw.get("architectures", [])),
        },
    )
    return TorchRunner(model, tokenizer, info)
