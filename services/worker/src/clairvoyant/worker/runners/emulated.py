"""``EmulatedRunner``: a ``ModelRunner`` with no model that takes as long as a real GPU would.

Each ``forward`` asks a roofline ``CostModel`` (a named GPU, a named model, a tensor-parallel degree)
how long the batch would take, waits that long through an injected ``sleep`` and returns logits that
make every sampler pick one placeholder token.  Everything else (KV block accounting, batching,
preemption, the prefix cache) is the real engine core, unchanged.

Live, ``sleep`` is ``time.sleep``: a worker started with ``--runner emulated`` serves in real time
and one small machine can front a "16-GPU cluster".  The simulator passes a function that advances
its virtual clock instead, so the same runner serves in virtual time.

Prompts are tokenized by a byte tokenizer (one token per UTF-8 byte, ChatML chat template) so text
and chat requests work without the real model's vocabulary; send token ids to control exact lengths.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from clairvoyant.worker.costmodel.gpus import GpuSpec, get_gpu
from clairvoyant.worker.costmodel.models import ModelSpec, get_model
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel, StepCost
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo, Tokenizer
from clairvoyant.worker.runners.tokenizer import ByteTokenizer

EMULATED_SPECIAL_TOKENS = ("<bos>", "<eos>", "<|im_start|>", "<|im_end|>")  # ids 256, 257, 258, 259
EMULATED_EOS_IDS = (257, 259)  # never sampled: the logits put all mass on the placeholder
PLACEHOLDER_TOKEN = ord("x")  # every generated token; printable, one byte, never EOS


class EmulatedRunner:
    """Implements ``runners.base.ModelRunner`` and ``runners.base.SizesOwnKvPool``.

    ``busy_seconds`` sums the predicted time of every step so far; ``last_step_seconds`` and
    ``last_step`` (the roofline terms) describe the latest one.
    """

    def __init__(
        self,
        model: str | ModelSpec = "llama-3.1-8b",
        gpu: str | GpuSpec = "H100-80G",
        tensor_parallel: int = 1,
        *,
        sleep: Callable[[float], None] = time.sleep,
        max_model_len: int | None = None,
        gpu_mem_util: float = 0.9,
        distinct_tokens: bool = False,
    ) -> None:
        """``distinct_tokens``: emit a printable token that depends on the sequence and position
        instead of the fixed placeholder, so that two responses never share a cached block by
        accident (the simulator replays responses into later prompts)."""
        model_spec = get_model(model) if isinstance(model, str) else model
        gpu_spec = get_gpu(gpu) if isinstance(gpu, str) else gpu
        self.cost = CostModel(gpu_spec, model_spec, tensor_parallel)
        if not 0.0 < gpu_mem_util <= 1.0:
            raise ValueError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util}")
        if self.cost.kv_capacity_tokens(gpu_mem_util) == 0:
            raise ValueError(
                f"{model_spec.name} does not fit {tensor_parallel} x {gpu_spec.name}: no memory left for KV; "
                "raise the tensor-parallel degree"
            )
        self.gpu_mem_util = gpu_mem_util
        tokenizer = ByteTokenizer(EMULATED_SPECIAL_TOKENS)
        self.tokenizer: Tokenizer = tokenizer
        context = min(model_spec.max_model_len, max_model_len or model_spec.max_model_len)
        self.info = ModelInfo(
            name=model_spec.name,
            vocab_size=tokenizer.vocab_size,
            max_model_len=context,
            eos_token_ids=EMULATED_EOS_IDS,
            num_layers=model_spec.layers,
            num_kv_heads=self.cost.kv_heads_per_gpu,
            head_dim=model_spec.head_dim,
            dtype="bfloat16",
            extra={"runner": "emulated", "gpu": gpu_spec.name, "tensor_parallel": str(tensor_parallel)},
        )
        self._sleep = sleep
        self.distinct_tokens = distinct_tokens
        self.num_blocks = 0
        self.block_size = 0
        self.steps = 0
        self.busy_seconds = 0.0
        self.last_step_seconds = 0.0
        self.last_step: StepCost | None = None

    def kv_bytes_per_token(self) -> int:
        """One GPU's share of a token's K and V (the pool is per GPU, like a real TP rank's)."""
        return self.cost.kv_bytes_per_token_per_gpu

    def default_num_blocks(self, block_size: int) -> int | None:
        return self.cost.kv_capacity_tokens(self.gpu_mem_util) // block_size

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        if self.num_blocks == 0:
            raise RuntimeError("allocate_kv must be called before forward")
        cost = self.cost.step_cost(BatchItem(len(item.token_ids), item.start_pos) for item in items)
        self.steps += 1
        self.busy_seconds += cost.seconds
        self.last_step_seconds = cost.seconds
        self.last_step = cost
        if cost.seconds > 0:
            self._sleep(cost.seconds)
        wanted = [item for item in items if item.want_logits]
        logits = torch.full((len(wanted), self.info.vocab_size), float("-inf"))
        if not self.distinct_tokens:
            logits[:, PLACEHOLDER_TOKEN] = 0.0  # greedy or sampled, at any temperature: the placeholder
            return logits
        for row, item in enumerate(wanted):
            position = item.start_pos + len(item.token_ids)
            logits[row, 33 + (item.seq_id * 131 + position * 7) % 94] = 0.0  # printable ASCII
        return logits

    @property
    def startup_seconds(self) -> float:
        """How long a real replica of this shape takes to start (weight loading and init)."""
        return self.cost.startup_time()
