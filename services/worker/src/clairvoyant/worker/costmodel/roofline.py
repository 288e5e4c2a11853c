"""``CostModel``: how long an engine step, a swap, a migration and a replica start take.

A roofline per engine step, per GPU of a tensor-parallel group (docs/costmodel.md has the derivation
and the calibration).  For a batch of items, item ``i`` computing ``n_i`` new tokens after ``s_i``
cached ones (``T = sum n_i`` tokens, ``R`` items, ``tp`` GPUs, ``kv_gpu`` one GPU's K/V bytes per token)::

    flops   = [2 * P_layers * T + 2 * P_head * R + 4 * L * H * d * sum_i keys_i] / tp
              keys_i = n_i * s_i + n_i * (n_i + 1) / 2        (causal attention pairs)
    bytes   = W_streamed / tp + kv_gpu * sum_i (s_i + n_i)   (weights once; KV read and written)
    compute = flops / (bf16_flops * mfu)
    memory  = bytes / (hbm_bandwidth * mbu)
    comm    = 2 * L * (allreduce_latency + 2 * (tp - 1) / tp * T * h * 2 / nvlink_bandwidth)   (tp > 1)
    step    = max(compute, memory) + (1 - overlap) * min(compute, memory) + comm + step_overhead

``overlap = 1`` is the classic roofline (the smaller term hides under the larger); the default,
``overlap = 0``, adds them: real kernels near the ridge point reach neither peak, and with it the
model fits the published numbers to 14 % instead of 35 % (docs/costmodel.md).

Pure: no clock, no I/O.  Times are seconds, sizes bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from clairvoyant.worker.costmodel.gpus import GB, GpuSpec
from clairvoyant.worker.costmodel.models import BF16_BYTES, ModelSpec

RUNTIME_RESERVE_BYTES = 2 * 2**30  # per GPU: CUDA context, NCCL buffers, peak activations
DEFAULT_LOAD_BANDWIDTH = 2.0 * GB  # bytes/s per GPU: safetensors from local NVMe into HBM
DEFAULT_INIT_SECONDS = 20.0  # process start, CUDA/NCCL init, memory profiling, CUDA-graph capture
DEFAULT_OVERLAP = 0.0  # fraction of min(compute, memory) hidden under the larger term (1 = roofline)
TRANSFER_LATENCY = 50e-6  # seconds to set up one host or network transfer (launch, RDMA handshake)


class BatchItem(NamedTuple):
    """One sequence's share of an engine step."""

    new_tokens: int  # tokens whose K/V this step computes (a prefill chunk, or 1 for a decode)
    cached_tokens: int = 0  # tokens already in the KV cache (earlier chunks, prefix hits, decode history)


class StepCost(NamedTuple):
    """The roofline terms of one step (per GPU), for diagnostics and tests."""

    seconds: float  # compute and memory (combined per ``overlap``) + communication + overhead
    compute_seconds: float
    memory_seconds: float
    communication_seconds: float
    overhead_seconds: float
    flops: float  # per GPU
    bytes: float  # HBM traffic per GPU

    @property
    def compute_bound(self) -> bool:
        return self.compute_seconds >= self.memory_seconds


class CostModel:
    """The roofline of ``model`` served by ``tp`` GPUs of kind ``gpu`` (one replica)."""

    def __init__(
        self,
        gpu: GpuSpec,
        model: ModelSpec,
        tp: int = 1,
        *,
        load_bandwidth: float = DEFAULT_LOAD_BANDWIDTH,
        init_seconds: float = DEFAULT_INIT_SECONDS,
        overlap: float = DEFAULT_OVERLAP,
    ) -> None:
        if tp < 1 or model.heads % tp:
            raise ValueError(f"tensor-parallel degree {tp} must be >= 1 and divide {model.heads} heads")
        if model.kv_heads % tp and tp % model.kv_heads:
            raise ValueError(f"tensor-parallel degree {tp} does not split {model.kv_heads} KV heads evenly")
        if load_bandwidth <= 0 or init_seconds < 0 or not 0.0 <= overlap <= 1.0:
            raise ValueError("need load_bandwidth > 0, init_seconds >= 0 and 0 <= overlap <= 1")
        self.gpu = gpu
        self.model = model
        self.tp = tp
        self.load_bandwidth = load_bandwidth
        self.init_seconds = init_seconds
        self.overlap = overlap
        # With more GPUs than KV heads each GPU keeps a replica of one head (as vLLM does).
        self.kv_heads_per_gpu = max(1, model.kv_heads // tp)
        self.kv_bytes_per_token_per_gpu = model.kv_bytes_per_token(self.kv_heads_per_gpu)
        self.weight_bytes_per_gpu = model.weight_bytes / tp
        self._layer_flops_per_token = 2.0 * model.layers * model.layer_params
        self._head_flops_per_item = 2.0 * model.head_params
        self._peak_flops = gpu.bf16_flops * gpu.mfu
        self._peak_bandwidth = gpu.hbm_bandwidth * gpu.mbu

    # ---- engine steps --------------------------------------------------------------------------
    def step_cost(self, items: Iterable[BatchItem]) -> StepCost:
        """The roofline terms of one step over ``items``; an empty batch costs nothing."""
        tokens = rows = keys = kv_tokens = 0
        for new, cached in items:
            if new < 1 or cached < 0:
                raise ValueError(f"a batch item needs new_tokens >= 1 and cached_tokens >= 0, got {new}, {cached}")
            tokens += new
            rows += 1
            keys += new * cached + new * (new + 1) // 2
            kv_tokens += cached + new
        if rows == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        model, tp = self.model, self.tp
        flops = (
            self._layer_flops_per_token * tokens + self._head_flops_per_item * rows + model.attention_flops(keys)
        ) / tp
        hbm_bytes = model.streamed_weight_bytes / tp + self.kv_bytes_per_token_per_gpu * kv_tokens
        compute = flops / self._peak_flops
        memory = hbm_bytes / self._peak_bandwidth
        comm = self.allreduce_seconds(tokens)
        overhead = self.gpu.step_overhead
        busy = max(compute, memory) + (1.0 - self.overlap) * min(compute, memory)
        return StepCost(busy + comm + overhead, compute, memory, comm, overhead, flops, hbm_bytes)

    def decode_run_seconds(self, cached_tokens: Sequence[int], num_steps: int) -> np.ndarray:
        """Seconds of each of ``num_steps`` consecutive decode-only steps of one batch.

        Item ``i`` decodes one token per step after ``cached_tokens[i]`` (plus one more per step).
        Element ``s`` equals ``step_cost([BatchItem(1, c + s) for c in cached_tokens]).seconds``
        bit for bit: the same operations in the same order, on arrays.
        """
        rows = len(cached_tokens)
        if rows == 0 or num_steps <= 0:
            return np.zeros(max(0, num_steps))
        if min(cached_tokens) < 0:
            raise ValueError("cached_tokens must be >= 0")
        steps = np.arange(num_steps, dtype=np.int64)
        # Per step: keys = kv_tokens = sum_i (c_i + s + 1).
        keys = (sum(cached_tokens) + rows) + rows * steps
        model, tp = self.model, self.tp
        attention = 4.0 * model.layers * model.heads * model.head_dim * keys  # model.attention_flops
        flops = (self._layer_flops_per_token * rows + self._head_flops_per_item * rows + attention) / tp
        hbm_bytes = model.streamed_weight_bytes / tp + self.kv_bytes_per_token_per_gpu * keys
        compute = flops / self._peak_flops
        memory = hbm_bytes / self._peak_bandwidth
        busy = np.maximum(compute, memory) + (1.0 - self.overlap) * np.minimum(compute, memory)
        return busy + self.allreduce_seconds(rows) + self.gpu.step_overhead

    def step_time(
        self, prefill_tokens_per_item: Sequence[int] = (), decode_context_lens: Sequence[int] = ()
    ) -> float:
        """Seconds for a step of fresh prefills (nothing cached) and decodes.

        ``decode_context_lens[i]`` counts the keys decode ``i`` attends over, its own token included.
        """
        items = [BatchItem(n, 0) for n in prefill_tokens_per_item]
        items += [BatchItem(1, context - 1) for context in decode_context_lens]
        return self.step_cost(items).seconds

    def allreduce_seconds(self, tokens: int) -> float:
        """Two ring all-reduces of the ``tokens x hidden`` activations per layer (attention, MLP)."""
        if self.tp == 1:
            return 0.0
        message = tokens * self.model.hidden * BF16_BYTES
        per_call = self.gpu.allreduce_latency + 2 * (self.tp - 1) / self.tp * message / self.gpu.nvlink_bandwidth
        return 2 * self.model.layers * per_call

    # ---- memory --------------------------------------------------------------------------------
    def kv_capacity_tokens(self, gpu_mem_util: float = 0.9) -> int:
        """Tokens of KV the replica holds when each GPU gives ``gpu_mem_util`` of its memory to
        weights, a fixed runtime reserve and the KV pool (vLLM's ``gpu_memory_utilization``)."""
        if not 0.0 < gpu_mem_util <= 1.0:
            raise ValueError(f"gpu_mem_util must be in (0, 1], got {gpu_mem_util}")
        free = gpu_mem_util * self.gpu.hbm_bytes - self.weight_bytes_per_gpu - RUNTIME_RESERVE_BYTES
        return max(0, int(free // self.kv_bytes_per_token_per_gpu))

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of ``tokens`` tokens across the whole replica (all its GPUs)."""
        return tokens * self.kv_bytes_per_token_per_gpu * self.tp

    # ---- transfers -----------------------------------------------------------------------------
    def swap_time(self, num_bytes: int) -> float:
        """Seconds to move ``num_bytes`` of the replica's KV between HBM and host memory (L1 <-> L2).

        Each GPU moves its ``1/tp`` share over its own PCIe link, all at once.
        """
        if num_bytes <= 0:
            return 0.0
        per_gpu = num_bytes / self.tp
        return TRANSFER_LATENCY + per_gpu / (self.gpu.pcie_bandwidth * self.gpu.pcie_efficiency)

    def migration_time(self, tokens: int) -> float:
        """Seconds to ship the KV of ``tokens`` tokens to another replica of the same shape.

        GPU ``r`` of the source sends its shard to GPU ``r`` of the destination (GPUDirect RDMA), all
        ranks at once, so the per-GPU network link is the bottleneck.
        """
        if tokens <= 0:
            return 0.0
        per_gpu = tokens * self.kv_bytes_per_token_per_gpu
        return TRANSFER_LATENCY + per_gpu / (self.gpu.network_bandwidth * self.gpu.network_efficiency)

    def startup_time(self) -> float:
        """Seconds from launching a replica to serving: fixed init plus loading each GPU's weight shard."""
        return self.init_seconds + self.weight_bytes_per_gpu / self.load_bandwidth
