"""The L3 backends: ``open_l3(url)`` opens the ``L3Store`` (``clairvoyant.worker.core.l3``) a URL
names, chosen by its scheme as LMCache chooses its remote connector.

``file:///ABSOLUTE/DIR[?max_gb=G]``
    One file per page under DIR (created if missing); every process opening the same DIR shares
    the pages.  ``max_gb``: capacity in GiB, least recently used pages removed beyond it
    (default: unbounded).
``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?ttl_s=S&prefix=P]``
    A Redis server (PORT 6379, DB 0 by default).  ``ttl_s``: each page expires S seconds after
    it was written (default: never; the server's ``maxmemory-policy`` evicts).  ``prefix``:
    prepended to every key, to share a database with other users (default: none).
``mooncake://MASTER_HOST[:PORT][?metadata=URL&segment_mb=M&buffer_mb=M&protocol=P&rdma_devices=D&local_hostname=H]``
    Mooncake Store: a ``mooncake_master`` at MASTER_HOST:PORT (default 50051).  ``metadata``:
    its HTTP metadata server (default ``http://MASTER_HOST:8080/metadata``, the master's
    ``--enable_http_metadata_server``).  ``segment_mb``: memory this process lends the store
    (default 512; 0 lends none).  Pages live in lenders' segments, so a page disappears with its
    lender.  ``buffer_mb``: this process's transfer buffer (default 64); one page must fit, and
    batches are split to fit.  ``protocol``: ``tcp`` (default) or ``rdma``, with
    ``rdma_devices`` (default: none named).  ``local_hostname``: the address other clients reach
    this one at (default: the local address of the route to the master).
``memory://[?capacity_pages=N]``
    ``MemoryL3`` in this process (not shared; default capacity 2**20 pages).

A bad URL or parameter raises ValueError naming the URL and these forms; a store that cannot be
reached raises ``L3Error`` within ``timeout_s``, which also bounds each later call where the
backend allows.
"""

from __future__ import annotations

from collections.abc import Callable

from clairvoyant.core.registry import Registry
from clairvoyant.worker.core.l3 import L3Error, L3Store, MemoryL3
from clairvoyant.worker.l3.url import ACCEPTED_FORMS, L3Url

__all__ = ["ACCEPTED_FORMS", "L3_BACKENDS", "L3Error", "L3Store", "L3Url", "open_l3"]

# scheme -> factory(url=L3Url, timeout_s=float).  Backends import their client library only
# when their scheme is opened: a worker without the mooncake extra still opens file:// and redis://.
L3_BACKENDS: Registry[L3Store] = Registry("L3 URL scheme")


def open_l3(url: str, *, timeout_s: float = 5.0) -> L3Store:
    """The store ``url`` names, connected.  ValueError for a bad URL; ``L3Error`` when the store
    cannot be reached within ``timeout_s``."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    parsed = L3Url(url)
    if parsed.scheme not in L3_BACKENDS:
        why = f"unknown scheme {parsed.scheme!r}" if parsed.scheme else "no scheme"
        raise parsed.error(why)
    factory: Callable[..., L3Store] = L3_BACKENDS.factory(parsed.scheme)
    return factory(url=parsed, timeout_s=timeout_s)


@L3_BACKENDS.register("memory")
def _open_memory(url: L3Url, timeout_s: float) -> L3Store:
    url.check_params("capacity_pages")
    if url.netloc or url.path not in ("", "/"):
        raise url.error("memory:// takes no host or path")
    return MemoryL3(capacity_pages=url.integer("capacity_pages", 1 << 20, minimum=1))


@L3_BACKENDS.register("file")
def _open_file(url: L3Url, timeout_s: float) -> L3Store:
    from clairvoyant.worker.l3.file_store import FileL3

    return FileL3.from_url(url)


@L3_BACKENDS.register("redis")
def _open_redis(url: L3Url, timeout_s: float) -> L3Store:
    from clairvoyant.worker.l3.redis_store import RedisL3

    return RedisL3.from_url(url, timeout_s=timeout_s)


@L3_BACKENDS.register("mooncake")
def _open_mooncake(url: L3Url, timeout_s: float) -> L3Store:
    from clairvoyant.worker.l3.mooncake_store import MooncakeL3

    return MooncakeL3.from_url(url, timeout_s=timeout_s)
