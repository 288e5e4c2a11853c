"""The contract between the engine core and a model runner.

The engine core (``clairvoyant.worker.core``) owns sequences, the paged KV block accounting, the
radix prefix cache and batch formation.  A runner owns the model and the physical KV storage; it
knows nothing about scheduling.  Each engine step hands the runner one batch of ``ForwardItem``s
(prefill chunks and decode tokens mixed) and gets back the last-position logits of the items that
asked for them.

Paged KV layout, as every runner must honour it::

    block_table = [7, 2, 9]        block_size = 4
    position:      0 1 2 3 | 4 5 6 7 | 8 9 ...
    physical:      block 7 | block 2 | block 9
    slot(pos)    = block_table[pos // block_size] * block_size + pos % block_size

A runner writes the K/V of ``token_ids`` at positions ``start_pos .. start_pos+len-1`` into their
slots, and attends over positions ``0 .. start_pos+len-1`` (causally) read back from the blocks.
Positions ``< start_pos`` were written by earlier steps or shared from the prefix cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


class ForwardItem(NamedTuple):
    """One sequence's share of an engine step."""

    seq_id: int
    token_ids: Sequence[int]  # tokens whose K/V are computed this step (a prefill chunk or 1 decode token)
    start_pos: int  # absolute position of token_ids[0] in the sequence
    # Physical blocks covering positions [0, start_pos + len(token_ids)): the sequence's own table,
    # valid while ``forward`` runs (the engine swaps in shared blocks after the step).
    block_table: Sequence[int]
    want_logits: bool  # True at the end of a prefill and for every decode token


@dataclass(frozen=True)
class ModelInfo:
    """What the rest of the system needs to know about a loaded model."""

    name: str  # the id served on /v1/models
    vocab_size: int
    max_model_len: int  # context window in tokens (prompt + output)
    eos_token_ids: tuple[int, ...]
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "float32"
    extra: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids, plus the chat template the model was trained with."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``; special tokens are skipped."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a chat, rendered with the model's template (messages: role/content dicts,
        an assistant turn's ``tool_calls``, a tool turn's ``tool_call_id``; ``tools``: OpenAI
        function tool dicts)."""
        ...


@runtime_checkable
class ModelRunner(Protocol):
    """Runs the model over paged KV.  Synchronous; called from the engine thread only."""

    info: ModelInfo
    tokenizer: Tokenizer

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V, all layers, for one token; the engine sizes its block pool with it."""
        ...

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        """Create the physical KV storage.  Called once, before the first ``forward``."""
        ...

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        """Compute one step.

        Returns float32 logits of shape ``[n, vocab_size]``, one row per item with ``want_logits``,
        in the order of ``items``.  ``n`` may be 0.
        """
        ...


@runtime_checkable
class SizesOwnKvPool(Protocol):
    """Optional for a ``ModelRunner``: it knows how many KV blocks its device holds.

    The worker asks it when no block count is configured, instead of sizing the pool from
    ``kv_cache_mb``.  The emulated runner answers from its cost model (the GPU's memory left after
    the weights); a runner that cannot tell returns ``None``.
    """

    def default_num_blocks(self, block_size: int) -> int | None:
        """KV blocks of ``block_size`` tokens the device holds, or ``None`` to use the configured size."""
        ...


@runtime_checkable
class FastForwardRunner(Protocol):
    """Optional for a ``ModelRunner``: its decode steps' tokens and durations are known in advance.

    The emulated runner computes nothing, so the engine can take many plain decode steps of one
    batch at once (``LLMEngine.plan_decode_run``) with exactly the tokens and predicted times that
    ``forward`` would have given step by step.  The simulator uses this to skip per-token work.
    """

    def forward_tokens(self, items: Sequence[ForwardItem]) -> list[int]:
        """``forward`` followed by sampling: the token of each item that wants logits, in order
        (the same under any sampling parameters), without building logits."""
        ...

    def decode_tokens(self, seq_id: int, first_position: int, num_steps: int) -> list[int]:
        """Tokens sampled by ``num_steps`` decode steps of sequence ``seq_id`` (any sampling
        parameters), the first step computing position ``first_position``."""
        ...

    def decode_run_seconds(self, cached_tokens: Sequence[int], num_steps: int) -> Sequence[float]:
        """Predicted seconds of each of ``num_steps`` decode-only steps of a batch whose item ``i``
        has ``cached_tokens[i]`` tokens computed before the first step.  Pure."""
        ...

    def account_steps(self, step_seconds: Sequence[float]) -> None:
        """Count steps taken through the fast path in the runner's diagnostics."""
        ...


@runtime_checkable
class CopiesKv(Protocol):
    """Optional for a ``ModelRunner``: it holds real KV tensors that a cached prefix can be read
    out of and written into (KV migration between workers, ``core/kv_transfer.py``).

    Both use the layout ``[num_layers, 2 (K, V), tokens, num_kv_heads, head_dim]`` in the runner's
    own dtype, addressed through a block table exactly as ``forward`` addresses it.
    """

    def read_kv(self, block_table: Sequence[int], num_tokens: int) -> torch.Tensor:
        """A copy of the K/V of positions ``0 .. num_tokens - 1``."""
        ...

    def write_kv(self, block_table: Sequence[int], first_position: int, kv: torch.Tensor) -> None:
        """Write ``kv`` (``kv.shape[2]`` tokens) at positions ``first_position ..`` of ``block_table``."""
        ...


@runtime_checkable
class EmulatesKvTransfer(Protocol):
    """Optional for a ``ModelRunner``: it holds no KV tensors, so a migrated prefix moves only in
    the block accounting, and takes the time its cost model says a real transfer would."""

    def kv_transfer_seconds(self, num_tokens: int) -> float:
        """Seconds to ship the KV of ``num_tokens`` tokens from a replica of this shape to another."""
        ...

    def recompute_seconds(self, num_tokens: int) -> float:
        """Seconds of one engine step prefilling ``num_tokens`` tokens from scratch (batch of one)."""
        ...


@runtime_checkable
class HoldsHostKv(Protocol):
    """Optional for a ``ModelRunner``: a host block pool (L2) beside the device pool (L1), and
    whole blocks moved between them and out to bytes (pages for L3, ``core/l3.py``).

    A page is one block's K and V of every layer, page-first:
    ``[num_layers, 2, block_size, num_kv_heads, head_dim]`` in the runner's dtype, as raw bytes.
    Copies are ordered with ``forward``: a block offloaded before a ``forward`` that overwrites it
    is copied as it was (on CUDA the copy runs on a side stream ordered by an event; on CPU it is
    done when the call returns).  A runner without tensors (the emulated one) moves nothing and
    charges the time its cost model gives to its next step.
    """

    def allocate_host_kv(self, num_blocks: int) -> None:
        """Create the host pool.  Called once, after ``allocate_kv``."""
        ...

    def offload(self, device_blocks: Sequence[int], host_blocks: Sequence[int]) -> None:
        """Copy device blocks to host blocks, pairwise (L1 -> L2)."""
        ...

    def load(self, host_blocks: Sequence[int], device_blocks: Sequence[int]) -> None:
        """Copy host blocks to device blocks, pairwise (L2 -> L1)."""
        ...

    def device_pages(self, device_blocks: Sequence[int]) -> list[bytes]:
        """Each device block's page (write-through from L1 to L3)."""
        ...

    def host_pages(self, host_blocks: Sequence[int]) -> list[bytes]:
        """Each host block's page (for L3)."""
        ...

    def set_host_pages(self, host_blocks: Sequence[int], pages: Sequence[bytes]) -> None:
        """Write pages into host blocks (from L3).  Raises ValueError for a page of the wrong size."""
        ...

    def page_nbytes(self) -> int:
        """Bytes of one page (0 for a runner without tensors)."""
        ...


@runtime_checkable
class ChargesTransfers(Protocol):
    """Optional for a ``ModelRunner`` without tensors: it charges tier transfers from its cost model
    (``HoldsHostKv`` calls charge PCIe time; the engine charges L3 time through ``charge_l3``)."""

    def charge_l3(self, num_blocks: int) -> None:
        """Add the time of moving ``num_blocks`` pages to or from L3 to the next step."""
        ...

    def host_transfer_seconds(self, num_blocks: int) -> float:
        """Seconds to move ``num_blocks`` blocks one way between device and host."""
        ...

    def recompute_seconds(self, num_tokens: int) -> float:
        """Seconds of one engine step prefilling ``num_tokens`` tokens from scratch."""
        ...
