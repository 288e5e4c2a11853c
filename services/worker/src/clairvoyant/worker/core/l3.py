"""The shared L3 tier's contract: pages of KV keyed by their block hash chain.

Modelled on SGLang HiCache's ``HiCacheStorage``: a page is one whole KV block (every layer's K and
V for ``block_size`` tokens, page-first, in the runner's dtype), stored under a key built from the
block's chained hash (``clairvoyant.core.blockhash``) and namespaced by model and tenant, so one
store can serve many models and tenants and a lookup never crosses either::

    cv/<model>/<tenant>/<16 hex digits of the chained hash>

``exists`` answers with the length of the leading run of keys present (a prefix is only usable up
to its first missing page), ``get`` returns ``None`` for a page that is gone, and ``put`` writes
only pages that are not there yet.  Backends live in ``clairvoyant.worker.l3`` (Mooncake Store,
Redis, a local directory); ``MemoryL3`` here is the in-process one the simulator and tests use.
Every call is blocking: the engine makes them on its transfer thread, never on the step path.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable
from urllib.parse import quote

KEY_PREFIX = "cv"


def page_key(model: str, tenant: str | None, block_hash: int) -> str:
    """The store key of the page whose chained hash is ``block_hash`` (tenant None: requests
    without a tenant).  Model and tenant are percent-encoded, so neither can forge the other's
    namespace with a ``/``."""
    return f"{KEY_PREFIX}/{quote(model, safe='')}/{quote(tenant or '-', safe='')}/{block_hash:016x}"


class L3Error(RuntimeError):
    """The store could not be reached or refused the operation; the caller degrades (treats the
    pages as missing, or drops the write) and never loses a request over it."""


@runtime_checkable
class L3Store(Protocol):
    """A shared page store.  Implementations must be safe to call from one thread other than the
    one that created them (the engine's transfer thread)."""

    name: str  # mooncake | redis | file | memory: said in the worker's log and stats

    def exists(self, keys: Sequence[str]) -> int:
        """How many of ``keys``, from the first, are all present."""
        ...

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Each key's page, or None where it is missing."""
        ...

    def put(self, keys: Sequence[str], pages: Sequence[bytes]) -> int:
        """Store the pages whose keys are absent; how many were written."""
        ...

    def remove(self, keys: Sequence[str]) -> int:
        """Delete what is present of ``keys``; how many were removed."""
        ...

    def close(self) -> None: ...


class MemoryL3:
    """An ``L3Store`` in this process: at most ``capacity_pages`` pages, least recently used out
    first (as Mooncake's and Redis' own eviction would).  Shared between the simulated replicas of
    one simulation, as a real L3 is shared between workers."""

    name = "memory"

    def __init__(self, capacity_pages: int = 1 << 20) -> None:
        if capacity_pages < 1:
            raise ValueError(f"capacity_pages must be >= 1, got {capacity_pages}")
        self.capacity_pages = capacity_pages
        self._pages: OrderedDict[str, bytes] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._pages)

    def exists(self, keys: Sequence[str]) -> int:
        run = 0
        for key in keys:
            if key not in self._pages:
                break
            run += 1
        return run

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        pages = self._pages
        out: list[bytes | None] = []
        for key in keys:
            page = pages.get(key)
            if page is not None:
                pages.move_to_end(key)
            out.append(page)
        return out

    def put(self, keys: Sequence[str], pages: Sequence[bytes]) -> int:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        store, written = self._pages, 0
        for key, page in zip(keys, pages, strict=True):
            if key in store:
                continue
            store[key] = bytes(page)
            written += 1
            if len(store) > self.capacity_pages:
                store.popitem(last=False)
                self.evicted += 1
        return written

    def remove(self, keys: Sequence[str]) -> int:
        return sum(self._pages.pop(key, None) is not None for key in keys)

    def close(self) -> None:
        self._pages.clear()


_PAGE_MAGIC = b"CVKV"
_PAGE_VERSION = 1
_HEADER = 12  # magic, version (u32 LE), token count (u32 LE)


def encode_page(token_ids: Sequence[int], kv: bytes) -> bytes:
    """A stored page: a small header, the block's token ids (so a page is self-describing and
    checked against its hash on the way back), then the K/V bytes (empty from a runner without
    tensors)."""
    tokens = array("I", token_ids).tobytes()
    return b"".join((_PAGE_MAGIC, _PAGE_VERSION.to_bytes(4, "little"), len(token_ids).to_bytes(4, "little"), tokens, kv))


def decode_page(page: bytes) -> tuple[list[int], bytes]:
    """(token ids, K/V bytes) of a page; ValueError for anything that is not one."""
    if len(page) < _HEADER or page[:4] != _PAGE_MAGIC:
        raise ValueError("not a KV page (bad magic)")
    version = int.from_bytes(page[4:8], "little")
    if version != _PAGE_VERSION:
        raise ValueError(f"KV page version {version}; this worker reads {_PAGE_VERSION}")
    count = int.from_bytes(page[8:12], "little")
    end = _HEADER + 4 * count
    if len(page) < end:
        raise ValueError("truncated KV page")
    return array("I", page[_HEADER:end]).tolist(), page[end:]
