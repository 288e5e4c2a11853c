"""``mooncake://``: Mooncake Store (``mooncake-transfer-engine-non-cuda``) over TCP or RDMA.

A ``mooncake_master`` keeps the metadata; clients lend memory segments that hold the data and
move pages between each other with the Transfer Engine.  What that means here:

- A page lives in some client's segment, possibly another worker's.  It stays readable by every
  client while its lender lives, and disappears when the lender closes or dies (``segment_mb=0``
  lends nothing: such a worker's pages live in the others' segments).  A ``mooncake_client``
  process lending memory keeps pages beyond the workers' lifetimes.
- Every lookup of a present page (``exists``, ``get``, and ``put``'s check for absent keys) takes
  a lease on it (the master's ``--default_kv_lease_ttl``, 10 s by default): ``remove`` within it
  leaves the page in place and does not count it (``leased_on_remove`` does).
- ``put`` of a key that exists is a no-op in Mooncake, and ``put`` here sends only the keys
  ``batch_is_exist`` reports absent.
- Every transfer goes through this client's buffer (``buffer_mb``), so batches are split to fit
  it; a page larger than the buffer cannot be stored (``L3Error``).
- Unreachable master or metadata server: ``L3Error`` at open within ``timeout_s`` (both are
  probed before Mooncake's own set-up, which retries for minutes).  Mooncake's master calls time
  out after ``timeout_s / 20`` (at least 0.2 s; ``MC_RPC_TIMEOUT_MS`` overrides it, process-wide),
  so a port that accepts connections but is no master fails the open after about 20 such
  timeouts.  Once the master is lost, calls fail within about one timeout, but closing the client
  (or letting it be collected, or exiting) then takes Mooncake 6-15 s, holding the interpreter's
  lock: stop workers before their master (the stack does).

Mooncake's native logging is cut to errors unless ``MC_LOG_LEVEL`` is set.
"""

from __future__ import annotations

import logging
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from clairvoyant.worker.core.l3 import L3Error
from clairvoyant.worker.l3.url import L3Url

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MASTER_PORT = 50051  # mooncake_master's --rpc_port default
DEFAULT_METADATA_PORT = 8080  # its --http_metadata_server_port default
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
BUFFER_SHARE = 0.9  # of the transfer buffer one batch may fill (its allocator aligns each page)
HEALTHY = 0


def load_store_class() -> Any:
    """``MooncakeDistributedStore``, or ``L3Error`` saying what to install."""
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")  # read when the library loads
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise L3Error(
            f"the mooncake:// L3 needs `pip install 'clairvoyant-worker[mooncake]'` and Debian's "
            f"libibverbs1 (`make install` installs both): {exc}"
        ) from exc
    return MooncakeDistributedStore


class MooncakeL3:
    """An ``L3Store`` on Mooncake Store; see the module docstring for what Mooncake implies."""

    name = "mooncake"

    def __init__(self, *, master: tuple[str, int], metadata_url: str, segment_bytes: int = 512 << 20,
                 buffer_bytes: int = 64 << 20, protocol: str = "tcp", rdma_devices: str = "",
                 local_hostname: str | None = None, timeout_s: float = 5.0) -> None:
        store_class = load_store_class()
        self.master = f"{master[0]}:{master[1]}"
        self.metadata_url = metadata_url
        self.timeout_s = timeout_s
        self.leased_on_remove = 0  # removals refused because a reader's lease still held the page
        self._budget = int(buffer_bytes * BUFFER_SHARE)
        self._page_bytes = 0  # the largest page seen: sizes get batches before their replies come
        self._closed = False
        route = _probe_tcp(master, timeout_s, "master")
        _probe_http(metadata_url, timeout_s)
        local_hostname = local_hostname or route
        # Read when a client is set up; Mooncake's default, 30 s a call and ~20 retries, would
        # hold a worker's start for ten minutes on a port that is not a master.
        os.environ.setdefault("MC_RPC_TIMEOUT_MS", str(max(200, round(timeout_s * 1000 / 20))))
        self._store = store_class()
        code = self._call("set-up", self._store.setup, local_hostname, metadata_url, segment_bytes,
                          buffer_bytes, protocol, rdma_devices, self.master)
        if code != 0:
            raise L3Error(f"Mooncake set-up failed (code {code}) with master {self.master}, "
                          f"metadata {metadata_url}, local address {local_hostname}")
        logger.info("Mooncake L3: master %s, metadata %s, this client %s lending %d MiB",
                    self.master, metadata_url, local_hostname, segment_bytes >> 20)

    @classmethod
    def from_url(cls, url: L3Url, *, timeout_s: float) -> MooncakeL3:
        url.check_params("metadata", "segment_mb", "buffer_mb", "protocol", "rdma_devices", "local_hostname")
        if not url.hostname:
            raise url.error("mooncake:// needs the master's host")
        if url.path not in ("", "/"):
            raise url.error("mooncake:// takes no path")
        master_port = url.port or DEFAULT_MASTER_PORT
        metadata = url.text_param("metadata", f"http://{_host_in_url(url.hostname)}:{DEFAULT_METADATA_PORT}/metadata")
        if not metadata.startswith(("http://", "https://")):
            raise url.error(f"metadata={metadata!r} must be the master's HTTP metadata URL")
        protocol = url.text_param("protocol", "tcp")
        if protocol not in ("tcp", "rdma"):
            raise url.error(f"protocol={protocol!r}: tcp or rdma")
        return cls(
            master=(url.hostname, master_port),
            metadata_url=metadata,
            segment_bytes=url.integer("segment_mb", 512, minimum=0) << 20,
            buffer_bytes=url.integer("buffer_mb", 64, minimum=1) << 20,
            protocol=protocol,
            rdma_devices=url.params.get("rdma_devices", ""),
            local_hostname=url.params.get("local_hostname") or None,
            timeout_s=timeout_s,
        )

    def exists(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        run = 0
        for code in self._present(keys):
            if code != 1:
                break
            run += 1
        return run

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        self._check_master()
        pages: list[bytes | None] = [None] * len(keys)
        start = 0
        while start < len(keys):
            known = self._page_bytes
            count = max(1, self._budget // known) if known else 1  # the first hit tells the size
            replies = self._call("get", self._store.get_batch, list(keys[start:start + count]))
            for offset, page in enumerate(replies):
                if page:  # b"" is Mooncake's "missing" (and "did not fit the buffer")
                    pages[start + offset] = page
                    self._page_bytes = max(self._page_bytes, len(page))
            if known and self._page_bytes > known:  # larger pages than planned: refetch the misses
                missed = [start + offset for offset, page in enumerate(replies) if not page]
                for index, page in zip(missed, self.get([keys[i] for i in missed]), strict=True):
                    pages[index] = page
            start += count
        return pages

    def put(self, keys: Sequence[str], pages: Sequence[bytes]) -> int:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        if any(len(page) == 0 for page in pages):
            raise ValueError("Mooncake cannot tell an empty page from a missing one")
        if not keys:
            return 0
        largest = max(len(page) for page in pages)
        if largest > self._budget:
            raise L3Error(f"a page of {largest} bytes does not fit this client's Mooncake buffer "
                          f"({self._budget} bytes usable): raise buffer_mb")
        absent = [(key, page) for key, page, code in zip(keys, pages, self._present(keys), strict=True)
                  if code != 1]
        for batch in self._fitting_batches(absent):
            code = self._call("put", self._store.put_batch, [key for key, _ in batch], [page for _, page in batch])
            if code != 0:
                raise L3Error(f"Mooncake put of {len(batch)} pages failed (code {code})")
            self._page_bytes = max(self._page_bytes, *(len(page) for _, page in batch))
        return len(absent)

    def remove(self, keys: Sequence[str]) -> int:
        if not keys:
            return 0
        self._check_master()
        removed = 0
        for key, code in zip(keys, self._call("remove", self._store.batch_remove, list(keys)), strict=True):
            if code == 0:
                removed += 1
            elif code == OBJECT_HAS_LEASE:
                self.leased_on_remove += 1
                logger.debug("Mooncake kept %s: a reader's lease holds it", key)
            elif code != OBJECT_NOT_FOUND:
                raise L3Error(f"Mooncake remove of {key} failed (code {code})")
        return removed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._store.close()
        except RuntimeError as exc:
            logger.warning("Mooncake close failed: %s", exc)

    def _present(self, keys: Sequence[str]) -> list[int]:
        """1 or 0 per key (Mooncake's ``batch_is_exist``); L3Error for its error codes."""
        self._check_master()
        codes: list[int] = self._call("exists", self._store.batch_is_exist, list(keys))
        failed = [code for code in codes if code < 0]
        if failed:
            raise L3Error(f"Mooncake exists failed (code {failed[0]}) at master {self.master}")
        return codes

    def _fitting_batches(self, items: list[tuple[str, bytes]]) -> Iterator[list[tuple[str, bytes]]]:
        batch: list[tuple[str, bytes]] = []
        size = 0
        for key, page in items:
            if batch and size + len(page) > self._budget:
                yield batch
                batch, size = [], 0
            batch.append((key, page))
            size += len(page)
        if batch:
            yield batch

    def _check_master(self) -> None:
        if self._closed:
            raise L3Error("the Mooncake L3 is closed")
        if self._store.health_check() != HEALTHY:  # a cached heartbeat state: costs nothing
            raise L3Error(f"the Mooncake master at {self.master} does not answer")

    def _call(self, what: str, function: Callable[..., T], *args: Any) -> T:
        try:
            return function(*args)
        except RuntimeError as exc:
            raise L3Error(f"Mooncake {what} failed: {exc}") from exc


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _probe_tcp(address: tuple[str, int], timeout_s: float, what: str) -> str:
    """Connect to ``address``; the local address of that route, or L3Error."""
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock:
            return str(sock.getsockname()[0])
    except OSError as exc:
        raise L3Error(f"the Mooncake {what} at {address[0]}:{address[1]} does not answer: {exc}") from exc


def _probe_http(url: str, timeout_s: float) -> None:
    """Any HTTP answer will do (a GET without a key is a 4xx); no answer is L3Error."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as Mooncake connects
    try:
        with direct.open(url, timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return
    except (OSError, ValueError) as exc:
        raise L3Error(f"the Mooncake metadata server at {url} does not answer: {exc}") from exc
