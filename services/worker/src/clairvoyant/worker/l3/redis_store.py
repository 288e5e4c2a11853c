"""``redis://``: pages as Redis strings, batched in pipelines of ``BATCH`` keys.

``put`` is ``SET key page NX [PX ttl]`` per page, so only absent pages are written and two
workers racing on one key both count right.  Eviction is the server's (``maxmemory-policy``,
e.g. ``allkeys-lru``), expiry the optional TTL.  Every socket operation is bounded by the
timeout and not retried, so an unreachable server costs one ``L3Error`` per call, not a hang.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from clairvoyant.worker.core.l3 import L3Error
from clairvoyant.worker.l3.url import L3Url

BATCH = 128  # keys per round trip, as HiCache's STORAGE_BATCH_SIZE


def _chunks(items: Sequence[Any], size: int = BATCH) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class RedisL3:
    """An ``L3Store`` on a Redis server; ``prefix`` is prepended to every key."""

    name = "redis"

    def __init__(self, client: redis.Redis, *, prefix: str = "", ttl_s: float | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self._ttl_ms = None if ttl_s is None else max(1, round(ttl_s * 1000))
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            client.close()
            raise L3Error(f"Redis at {self.where} does not answer: {exc}") from exc

    @classmethod
    def from_url(cls, url: L3Url, *, timeout_s: float) -> RedisL3:
        url.check_params("ttl_s", "prefix")
        if not url.hostname:
            raise url.error("redis:// needs a host")
        db_text = url.path.strip("/") or "0"
        if not db_text.isdigit():
            raise url.error(f"the database {db_text!r} is not a number")
        client = redis.Redis(
            host=url.hostname, port=url.port or 6379, db=int(db_text),
            username=url.username or None, password=url.password or None,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries=0),
        )  # fmt: skip
        ttl_s = url.number("ttl_s", None, minimum=0, exclusive=True)
        return cls(client, prefix=url.params.get("prefix", ""), ttl_s=ttl_s)

    @property
    def where(self) -> str:
        kwargs = self.client.connection_pool.connection_kwargs
        return f"{kwargs.get('host')}:{kwargs.get('port')}/{kwargs.get('db')}"

    def _keys(self, keys: Sequence[str]) -> list[str]:
        return [self.prefix + key for key in keys]

    def exists(self, keys: Sequence[str]) -> int:
        run = 0
        for chunk in _chunks(self._keys(keys)):
            with self._failing_as_l3("exists"):
                pipe = self.client.pipeline(transaction=False)
                for key in chunk:
                    pipe.exists(key)
                present = pipe.execute()
            for found in present:
                if not found:
                    return run
                run += 1
        return run

    def get(self, keys: Sequence[str]) -> list[bytes | None]:
        pages: list[bytes | None] = []
        for chunk in _chunks(self._keys(keys)):
            with self._failing_as_l3("get"):
                pages.extend(cast(list[bytes | None], self.client.mget(chunk)))  # not decode_responses
        return pages

    def put(self, keys: Sequence[str], pages: Sequence[bytes]) -> int:
        if len(keys) != len(pages):
            raise ValueError(f"{len(keys)} keys for {len(pages)} pages")
        written = 0
        full_keys = self._keys(keys)
        for start in range(0, len(full_keys), BATCH):
            with self._failing_as_l3("put"):
                pipe = self.client.pipeline(transaction=False)
                for key, page in zip(full_keys[start:start + BATCH], pages[start:start + BATCH], strict=True):
                    pipe.set(key, page, nx=True, px=self._ttl_ms)
                written += sum(1 for stored in pipe.execute() if stored)
        return written

    def remove(self, keys: Sequence[str]) -> int:
        removed = 0
        for chunk in _chunks(self._keys(keys)):
            with self._failing_as_l3("remove"):
                removed += int(self.client.unlink(*chunk))
        return removed

    def close(self) -> None:
        self.client.close()

    def _failing_as_l3(self, operation: str) -> AbstractContextManager[None]:
        return _as_l3_error(f"Redis {operation} at {self.where}")


@contextmanager
def _as_l3_error(what: str) -> Iterator[None]:
    """A Redis or socket error inside becomes ``L3Error`` naming what failed."""
    try:
        yield
    except (redis.RedisError, OSError) as exc:
        raise L3Error(f"{what} failed: {exc}") from exc
