"""The ``redis://`` store beyond the contract: its key prefix, page expiry, and a server that
goes away."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from clairvoyant.stack.natsserver import free_port, port_open
from clairvoyant.worker.core.l3 import L3Error, page_key
from clairvoyant.worker.l3 import open_l3
from clairvoyant.worker.l3.redis_store import RedisL3

pytestmark = pytest.mark.integration


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A redis-server of this test's own, to stop under the store."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no",
                                "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not port_open("127.0.0.1", port):
        assert time.monotonic() < deadline and process.poll() is None, "redis-server did not start"
        time.sleep(0.02)
    try:
        yield process, port
    finally:
        process.kill()
        process.wait()


def test_pages_live_under_the_prefix_and_expire_after_the_ttl(redis_url: str) -> None:
    url = redis_url.replace("ttl_s=600", "ttl_s=0.5")
    store = open_l3(url)
    assert isinstance(store, RedisL3)
    key = page_key(f"model-{uuid.uuid4().hex[:8]}", "tenant", 1)
    try:
        assert store.put([key], [b"page"]) == 1
        raw = redis.Redis("127.0.0.1", 6379)
        assert raw.get(store.prefix + key) == b"page"
        assert raw.get(key) is None
        assert 0 < raw.pttl(store.prefix + key) <= 500
        raw.close()
        time.sleep(0.7)
        assert store.exists([key]) == 0
        assert store.put([key], [b"again"]) == 1
    finally:
        store.close()


def test_a_lost_server_fails_calls_as_l3_error_within_the_timeout(
        own_redis: tuple[subprocess.Popen[bytes], int]) -> None:
    process, port = own_redis
    store = open_l3(f"redis://127.0.0.1:{port}/0", timeout_s=1.0)
    keys = [page_key("model", None, n) for n in range(2)]
    assert store.put(keys[:1], [b"x"]) == 1
    process.kill()
    process.wait()
    for call in (lambda: store.exists(keys), lambda: store.get(keys), lambda: store.put(keys, [b"y", b"z"]),
                 lambda: store.remove(keys)):
        started = time.monotonic()
        with pytest.raises(L3Error, match="Redis"):
            call()
        assert time.monotonic() - started < 1.5
    store.close()
