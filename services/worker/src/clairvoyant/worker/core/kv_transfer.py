"""KV migration between workers: a cached prefix read out of one engine and cached in another.

    victim engine                                 thief engine
    export_prefix(tokens | session) ─> KvPrefix ─> import_prefix: reserve_prefix (cached head +
      the prefix's blocks, read                      fresh blocks) -> runner.write_kv -> commit_prefix
      through the block table                        (the fresh blocks join the radix cache)

A prefix is whole blocks of the exporting engine (only full blocks are ever cached); the importer
keeps the whole blocks of its own block size, skips the head it already caches and writes the rest.
With a ``CopiesKv`` runner the K/V tensors travel; a runner without tensors (the emulated one) moves
the accounting only, and whoever drives the transfer charges its modelled time
(``EmulatesKvTransfer.kv_transfer_seconds``).  The exporter keeps its copy: the blocks age out of its
cache like any other.

Both functions are engine-thread work: they touch the block manager and the runner's KV store, so
the live worker runs them through ``AsyncEngine.call`` and the simulator between events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from clairvoyant.worker.core.block_manager import BlockManager
from clairvoyant.worker.core.radix_cache import BlockTag, Namespace
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.base import CopiesKv, ModelRunner


class KvTransferError(ValueError):
    """A prefix this engine cannot take (another layout, no prefix cache); nothing changed."""


@dataclass(frozen=True)
class KvPrefix:
    """A cached prefix between two engines."""

    namespace: Namespace  # the tenant whose tree it was cached in
    token_ids: tuple[int, ...]  # whole blocks of the exporter
    kv: torch.Tensor | None  # [num_layers, 2, tokens, kv_heads, head_dim]; None without tensors
    workflow_id: str | None = None  # the session the importer tags the blocks with

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class ImportResult(NamedTuple):
    cached_tokens: int  # prefix tokens the importer holds cached now (whole blocks of its own size)
    imported_tokens: int  # of which this import wrote (the rest were cached already)


def kv_layout(runner: ModelRunner) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of the runner's KV."""
    info = runner.info
    return info.num_layers, info.num_kv_heads, info.head_dim


def export_prefix(
    kv: BlockManager,
    runner: ModelRunner,
    namespace: Namespace,
    *,
    token_ids: Sequence[int] | None = None,
    workflow_id: str | None = None,
) -> KvPrefix | None:
    """The longest cached prefix of ``token_ids`` or, without them, ``workflow_id``'s session path
    (``RadixCache.session_path``); None when nothing of it is cached.  ``workflow_id`` also names
    the session the importer tags the blocks with.  Changes nothing, not even the cache's recency:
    a read for another worker is not a use here."""
    cache = kv.cache
    if cache is None:
        return None
    if token_ids is not None:
        blocks = cache.peek(namespace, token_ids, len(token_ids) // kv.block_size)
        tokens = list(token_ids[: len(blocks) * kv.block_size])
    elif workflow_id is not None:
        blocks, tokens = cache.session_path(namespace, workflow_id)
    else:
        raise ValueError("export_prefix needs token_ids or a workflow_id")
    if not blocks:
        return None
    tensors = runner.read_kv(blocks, len(tokens)) if isinstance(runner, CopiesKv) else None
    return KvPrefix(namespace, tuple(tokens), tensors, workflow_id)


def check_prefix(runner: ModelRunner, prefix: KvPrefix) -> None:
    """Raise ``KvTransferError`` unless ``prefix`` fits ``runner``'s KV layout."""
    if isinstance(runner, CopiesKv):
        if prefix.kv is None:
            raise KvTransferError("the prefix carries no K/V tensors; this worker needs them")
        layers, heads, head_dim = kv_layout(runner)
        expected = (layers, 2, prefix.num_tokens, heads, head_dim)
        if tuple(prefix.kv.shape) != expected:
            raise KvTransferError(f"K/V of shape {tuple(prefix.kv.shape)}; this worker needs {expected}")
    elif prefix.kv is not None:
        raise KvTransferError("the prefix carries K/V tensors; this worker holds none")


def import_prefix(kv: BlockManager, runner: ModelRunner, prefix: KvPrefix) -> ImportResult | None:
    """Cache ``prefix``'s whole blocks (of ``kv``'s block size) that are not cached yet, so that a
    request starting with it hits.  None (no change) when the pool has no room for them; raises
    ``KvTransferError`` (no change) when the prefix does not fit the runner or caching is off."""
    check_prefix(runner, prefix)
    if kv.cache is None:
        raise KvTransferError("this worker's prefix cache is disabled")
    usable = prefix.num_tokens // kv.block_size * kv.block_size
    if usable == 0:
        return ImportResult(0, 0)
    reservation = kv.reserve_prefix(prefix.namespace, prefix.token_ids[:usable])
    if reservation is None:
        return None
    start = len(reservation.cached) * kv.block_size
    if reservation.new and isinstance(runner, CopiesKv):
        assert prefix.kv is not None
        try:
            runner.write_kv(reservation.block_table, start, prefix.kv[:, :, start:usable])
        except Exception:
            kv.release_prefix(reservation)
            raise
    # Tagged as the session's prompt blocks: here they will be the head of its next prompts.
    lineage = None if prefix.namespace is None else Lineage(prefix.namespace, prefix.workflow_id)
    kv.commit_prefix(reservation, BlockTag(lineage, "prompt"))
    return ImportResult(usable, usable - start)
