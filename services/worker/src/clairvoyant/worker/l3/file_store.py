"""``file://``: one file per page in a local (or shared) directory, as SGLang's HiCacheFile.

Layout: ``DIR/<first 2 hex>/<32 hex of BLAKE2b-128 of the key>.page``, so any key gives a short,
safe name.  A page is written to a hidden temporary file beside its final name and hard-linked
into place, which is atomic and fails if the name exists: a reader never sees a partial page,
and of two writers racing on one key exactly one wins (``put`` counts only its own).

A page's mtime is when it was last written or read (``clock_ns``, wall time, so processes
agree); with a capacity, the pages with the oldest go first once the directory holds more than
the cap.  Each process counts what it writes and rescans the
directory's real total every ``RESCAN_EVERY`` writes or whenever its count passes the cap, so
the cap holds across processes to within what they write between rescans.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from clairvoyant.worker.core.l3 import L3Error
from clairvoyant.worker.l3.url import L3Url

logger = logging.getLogger(__name__)

PAGE_SUFFIX = ".page"
RESCAN_EVERY = 1024  # page writes between two looks at the directory's real total
LOW_WATER = 0.9  # eviction brings the total down to this fraction of the cap


class FileL3:
    """An ``L3Store`` in a directory; see the module docstring for the layout and eviction."""

    name = "file"

    def __init__(self, directory: Path, *, max_bytes: int | None = None,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        if not directory.is_absolute():
            raise ValueError(f"the L3 directory must be absolute, got {str(directory)!r}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        self._clock_ns = clock_ns
        self.evicted = 0  # pages this process removed to stay under the cap
        self._lock = threading.Lock()  # guards the counters below
        self._used_bytes = 0  # the directory's total at the last rescan, plus our writes since
        self._writes_since_scan = 0
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise L3Error(f"cannot create the L3 directory {directory}: {exc}") from exc
        if max_bytes is not None:
            self._rescan_and_evict()

    @classmethod
    def from_url(cls, url: L3Url) -> FileL3:
        url.check_params("max_gb")
        if url.netloc not in ("", "localhost"):
            raise url.error("file:// names a local directory: file:///ABSOLUTE/DIR")
        if not url.path.startswith("/") or url.path.rstrip("/") == "":
            raise url.error("file:// needs an absolute directory other than /")
        max_gb = url.number("max_gb", None, minimum=0, exclusive=True)
        max_bytes = None if max_gb is None else max(1, int(max_gb * (1 << 30)))
        return cls(Path(url.path), max_bytes=max_bytes)

    def path_of(self, key: str) -> Path:
        digest = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
        return self.directory / digest[:2] / (digest + PAGE_SUFFIX)

    def exists(self, keys: Sequence[str]) -> int:
        run = 0
        for key in keys:
            if not self.path_of(key).is_file():
                break
            run += 1
        return run

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        pages: list[bytes | None] = []
        for key in keys:
            path = self.path_of(key)
            try:
                page = path.read_bytes()
            except FileNotFoundError:
                pages.append(None)
                continue
            except OSError as exc:
                raise L3Error(f"cannot read {path}: {exc}") from exc
            pages.append(page)
            now = self._clock_ns()
            with contextlib.suppress(OSError):  # evicted since the read: the page we hold is whole
                os.utime(path, ns=(now, now))  # recency for the LRU, whichever process evicts
        return pages

    def put(self, keys: Sequence[str], pages: Sequence[bytes]) -> int:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        written = written_bytes = 0
        for key, page in zip(keys, pages, strict=True):
            path = self.path_of(key)
            if path.exists():
                continue
            if self._write_new(path, page):
                written += 1
                written_bytes += len(page)
        if self.max_bytes is not None and written:
            with self._lock:
                self._used_bytes += written_bytes
                self._writes_since_scan += written
                due = self._used_bytes > self.max_bytes or self._writes_since_scan >= RESCAN_EVERY
            if due:
                self._rescan_and_evict()
        return written

    def _write_new(self, path: Path, page: bytes) -> bool:
        """Write ``page`` at ``path`` unless something is there already; whether we wrote it."""
        temporary = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            try:
                temporary.write_bytes(page)
            except FileNotFoundError:
                path.parent.mkdir(parents=True, exist_ok=True)
                temporary.write_bytes(page)
            now = self._clock_ns()
            os.utime(temporary, ns=(now, now))
            os.link(temporary, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            raise L3Error(f"cannot write {path}: {exc}") from exc
        finally:
            temporary.unlink(missing_ok=True)

    def remove(self, keys: Sequence[str]) -> int:
        removed = removed_bytes = 0
        for key in keys:
            path = self.path_of(key)
            try:
                size = path.stat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise L3Error(f"cannot remove {path}: {exc}") from exc
            removed += 1
            removed_bytes += size
        with self._lock:
            self._used_bytes = max(0, self._used_bytes - removed_bytes)
        return removed

    def _rescan_and_evict(self) -> None:
        """Total the directory's pages and, over the cap, remove the least recently used down to
        ``LOW_WATER`` of it."""
        assert self.max_bytes is not None
        entries: list[tuple[int, int, str]] = []  # (mtime ns, size, path)
        try:
            with os.scandir(self.directory) as shards:
                for shard in shards:
                    if not shard.is_dir(follow_symlinks=False):
                        continue
                    with os.scandir(shard.path) as files:
                        for entry in files:
                            if not entry.name.endswith(PAGE_SUFFIX) or entry.name.startswith("."):
                                continue
                            try:
                                stat = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            entries.append((stat.st_mtime_ns, stat.st_size, entry.path))
        except OSError as exc:
            raise L3Error(f"cannot scan the L3 directory {self.directory}: {exc}") from exc
        total = sum(size for _, size, _ in entries)
        evicted = 0
        if total > self.max_bytes:
            target = int(self.max_bytes * LOW_WATER)
            for _, size, path in sorted(entries):
                if total <= target:
                    break
                try:
                    os.unlink(path)
                    evicted += 1
                except FileNotFoundError:
                    pass  # another process evicted or removed it first
                except OSError as exc:
                    raise L3Error(f"cannot evict {path}: {exc}") from exc
                total -= size
            logger.debug("file L3 %s: evicted %d pages; %d bytes left", self.directory, evicted, total)
        with self._lock:
            self._used_bytes = total
            self._writes_since_scan = 0
            self.evicted += evicted

    def close(self) -> None:
        """Nothing to release: the pages stay for the next process."""
