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
DISTINCT_FIRST, DISTINCT_COUNT = 33, 94  # distinct_tokens: printable ASCII '!' .. '~'


def _distinct_row(seq_id: int, position: int) -> int:
    """``distinct_tokens``: the emitted token for ``position`` is ``DISTINCT_FIRST`` + this."""
    return (seq_id * 131 + position * 7) % DISTINCT_COUNT


# distinct_tokens: the emitted tokens of consecutive positions, one period, and each row's place in it.
_TOKEN_CYCLE = [DISTINCT_FIRST + (7 * i) % DISTINCT_COUNT for i in range(DISTINCT_COUNT)]
_CYCLE_INDEX = {(7 * i) % DISTINCT_COUNT: i for i in range(DISTINCT_COUNT)}


class EmulatedRunner:
    """Implements ``runners.base.ModelRunner``, ``SizesOwnKvPool``, ``FastForwardRunner``,
    ``EmulatesKvTransfer``, ``HoldsHostKv`` and ``ChargesTransfers``.

    Tier transfers move no data: their modelled time is charged to the next step.  Copies between
    device and host (PCIe) overlap that step's compute layer by layer, as HiCache's load-back
    does (layer i+1 moves while layer i computes): the step lasts ``max(compute, copies)`` plus
    one layer's share of the copies.  An L3 fetch (the node's network) is waited for in full.

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
        absorb_host_time: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``distinct_tokens``: emit a printable token that depends on the sequence and position
        instead of the fixed placeholder, so that two responses never share a cached block by
        accident (the simulator replays responses into later prompts).

        ``absorb_host_time`` (live workers): the roofline's step time already contains
        ``GpuSpec.step_overhead`` for the engine's host work (scheduling, sampling, handing tokens
        out), and a live engine really spends that time between two forwards.  So each sleep is
        shortened by the wall time since the previous forward returned, up to ``step_overhead``,
        and a step lasts what the cost model says instead of that plus the host work.  The cap
        means an engine slower than the modelled overhead still shows as slower, and after an
        idle gap at most one overhead is absorbed.  The simulator leaves it off (its sleep is a
        virtual clock and host time is not part of virtual time)."""
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
        self._clock = clock
        self.absorb_host_time = absorb_host_time
        self._last_return: float | None = None  # clock() when the previous forward returned
        self.distinct_tokens = distinct_tokens
        # One logits row per token the runner can emit (-inf but for that token), built once:
        # a step gathers its rows with one index_select instead of writing each row.
        emitted = range(DISTINCT_FIRST, DISTINCT_FIRST + DISTINCT_COUNT) if distinct_tokens else [PLACEHOLDER_TOKEN]
        self._emitted = list(emitted)  # the token of each row
        self._rows = torch.full((len(emitted), tokenizer.vocab_size), float("-inf"))
        self._rows[range(len(emitted)), self._emitted] = 0.0
        self.num_blocks = 0
        self.block_size = 0
        self.num_host_blocks = 0
        self.transfer_seconds = 0.0  # tier transfers so far
        self._copy_debt = 0.0  # device<->host copies for the next step (overlapped with it)
        self._wait_debt = 0.0  # L3 fetches for the next step (waited for)
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
        self._take_step(items)
        # Greedy or sampled, at any temperature, each row can only give its one token.
        return self._rows.index_select(0, torch.tensor(self._emitted_rows(items), dtype=torch.long))

    def forward_tokens(self, items: Sequence[ForwardItem]) -> list[int]:
        """FastForwardRunner: the tokens ``forward``'s logits leave to any sampler."""
        self._take_step(items)
        return [self._emitted[row] for row in self._emitted_rows(items)]

    def _emitted_rows(self, items: Sequence[ForwardItem]) -> list[int]:
        """Per item that wants logits, the row of ``_rows`` (and index in ``_emitted``) of its token."""
        if not self.distinct_tokens:
            return [0 for item in items if item.want_logits]  # the placeholder
        return [_distinct_row(item.seq_id, item.start_pos + len(item.token_ids)) for item in items if item.want_logits]

    def _take_step(self, items: Sequence[ForwardItem]) -> None:
        """What a step costs: its predicted time is accounted and waited out."""
        if self.num_blocks == 0:
            raise RuntimeError("allocate_kv must be called before forward")
        cost = self.cost.step_cost(BatchItem(len(item.token_ids), item.start_pos) for item in items)
        copies, layers = self._copy_debt, self.cost.model.layers
        seconds = max(cost.seconds, copies) + copies / layers + self._wait_debt
        self._copy_debt = self._wait_debt = 0.0
        self.steps += 1
        self.busy_seconds += seconds
        self.last_step_seconds = seconds
        self.last_step = cost
        wait = seconds
        if self.absorb_host_time and self._last_return is not None:
            wait -= min(self._clock() - self._last_return, self.cost.gpu.step_overhead)
        if wait > 0:
            self._sleep(wait)
        if self.absorb_host_time:
            self._last_return = self._clock()

    # ---- HoldsHostKv and ChargesTransfers: the L2 pool moves accounting, and charges time --------
    def default_num_host_blocks(self, block_size: int, fraction: float = 0.5) -> int:
        """Host blocks in ``fraction`` of the node's DRAM share of one GPU (0 when unknown)."""
        dram = self.cost.gpu.host_dram_bytes * fraction
        return int(dram // (self.cost.kv_bytes_per_token_per_gpu * block_size))

    def allocate_host_kv(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_host_blocks = num_blocks

    def host_transfer_seconds(self, num_blocks: int) -> float:
        return self.cost.swap_time(self.cost.kv_bytes(num_blocks * self.block_size)) if num_blocks > 0 else 0.0

    def offload(self, device_blocks: Sequence[int], host_blocks: Sequence[int]) -> None:
        seconds = self.host_transfer_seconds(len(device_blocks))
        self._copy_debt += seconds
        self.transfer_seconds += seconds

    def load(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None:
        seconds = self.host_transfer_seconds(len(host_blocks))
        self._copy_debt += seconds
        self.transfer_seconds += seconds

    def device_pages(self, device_blocks: Sequence[int]) -> list[bytes]:
        """Free: a write-through copy runs on its own stream beside the compute (as HiCache's does)."""
        return [b""] * len(device_blocks)

    def host_pages(self, host_blocks: Sequence[int]) -> list[bytes]:
        return [b""] * len(host_blocks)

    def set_host_pages(self, host_blocks: Sequence[int], pages: Sequence[bytes]) -> None:
        if any(pages):
            raise ValueError("the emulated runner holds no K/V: pages must be empty")

    def page_nbytes(self) -> int:
        return 0

    def charge_l3(self, num_blocks: int) -> None:
        """An L3 fetch of ``num_blocks`` pages over the node's network (``migration_time``), which
        the request waits for; puts run in the background and cost the step nothing."""
        if num_blocks > 0:
            seconds = self.cost.migration_time(num_blocks * self.block_size)
            self._wait_debt += seconds
            self.transfer_seconds += seconds

    # ---- EmulatesKvTransfer: a migrated prefix's modelled time -----------------------------------
    def kv_transfer_seconds(self, num_tokens: int) -> float:
        """``CostModel.migration_time``: each GPU's share of the tokens' KV (``kv_bytes_per_token``
        bytes per token) over its inter-node link (``GpuSpec.network_bandwidth`` x
        ``network_efficiency``: 50 GB/s x 0.8 per H100 of a DGX H100), plus one transfer set-up."""
        return self.cost.migration_time(num_tokens)

    def recompute_seconds(self, num_tokens: int) -> float:
        return self.cost.step_cost([BatchItem(num_tokens, 0)]).seconds if num_tokens > 0 else 0.0

    # ---- FastForwardRunner: what ``forward`` would give, many decode steps at once ---------------
    def decode_tokens(self, seq_id: int, first_position: int, num_steps: int) -> list[int]:
        """A decode step computing position ``p`` samples the token for position ``p + 1``."""
        if not self.distinct_tokens:
            return [PLACEHOLDER_TOKEN] * num_steps
        # Row(p) = (131 s + 7 p) mod 94 steps by 7 per position: a slice of the cycle, from its phase.
        start = _CYCLE_INDEX[_distinct_row(seq_id, first_position + 1)]
        cycle = _TOKEN_CYCLE * (1 + (start + num_steps) // DISTINCT_COUNT)
        return cycle[start : start + num_steps]

    def decode_run_seconds(self, cached_tokens: Sequence[int], num_steps: int) -> Sequence[float]:
        return self.cost.decode_run_seconds(cached_tokens, num_steps).tolist()

    def account_steps(self, step_seconds: Sequence[float]) -> None:
        for seconds in step_seconds:  # the same additions, in order, as one ``forward`` per step
            self.busy_seconds += seconds
        self.steps += len(step_seconds)
        if step_seconds:
            self.last_step_seconds = step_seconds[-1]
            self.last_step = None  # the terms of a fast-forwarded step are not kept

    @property
    def startup_seconds(self) -> float:
        """How long a real replica of this shape takes to start (weight loading and init)."""
        return self.cost.startup_time()
