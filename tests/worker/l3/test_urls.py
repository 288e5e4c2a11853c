"""``open_l3``: which store each URL opens, and what a bad URL or an unreachable server says."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clairvoyant.worker.core.l3 import L3Error, MemoryL3
from clairvoyant.worker.l3 import L3_BACKENDS, open_l3
from clairvoyant.worker.l3.file_store import FileL3

BAD_URLS = {
    "ftp://host/dir": "unknown scheme 'ftp'",
    "/var/l3": "no scheme",
    "file://relative/dir": "local directory",
    "file:///": "absolute directory",
    "file:///tmp/l3?max_gb=-1": "max_gb='-1' must be > 0",
    "file:///tmp/l3?max_gb=0": "must be > 0",
    "file:///tmp/l3?max_gb=lots": "not a number",
    "file:///tmp/l3?size=1": "unknown parameter(s) size; file:// takes: max_gb",
    "file:///tmp/l3?max_gb=1&max_gb=2": "given twice",
    "redis://": "needs a host",
    "redis://127.0.0.1:6379/cache": "'cache' is not a number",
    "redis://127.0.0.1:99999/0": "bad port",
    "redis://127.0.0.1/0?ttl_s=0": "ttl_s='0' must be > 0",
    "redis://127.0.0.1/0?ttl=5": "unknown parameter(s) ttl",
    "mooncake://": "needs the master's host",
    "mooncake://127.0.0.1/path": "takes no path",
    "mooncake://127.0.0.1?protocol=udp": "tcp or rdma",
    "mooncake://127.0.0.1?segment_mb=-1": "must be >= 0",
    "mooncake://127.0.0.1?buffer_mb=0": "must be >= 1",
    "mooncake://127.0.0.1?segment_mb=1.5": "not an integer",
    "mooncake://127.0.0.1?metadata=etcd://127.0.0.1:2379": "HTTP metadata URL",
    "mooncake://127.0.0.1?metadata=": "is empty",
    "memory://host": "no host or path",
    "memory://?capacity_pages=0": "must be >= 1",
}


@pytest.mark.unit
@pytest.mark.parametrize(("url", "why"), BAD_URLS.items())
def test_a_bad_url_names_itself_the_reason_and_the_accepted_forms(url: str, why: str) -> None:
    with pytest.raises(ValueError) as raised:
        open_l3(url)
    message = str(raised.value)
    assert repr(url) in message
    assert why in message
    assert "accepted forms:" in message
    for scheme in L3_BACKENDS:
        assert f"{scheme}://" in message


@pytest.mark.unit
def test_a_password_in_a_bad_url_is_masked() -> None:
    with pytest.raises(ValueError) as raised:
        open_l3("redis://:hunter22@127.0.0.1:6379/x")
    assert "hunter22" not in str(raised.value)


@pytest.mark.unit
def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        open_l3("memory://", timeout_s=0)


@pytest.mark.unit
def test_memory_and_file_urls_open_what_they_say(tmp_path: Path) -> None:
    memory = open_l3("memory://?capacity_pages=3")
    assert isinstance(memory, MemoryL3) and memory.capacity_pages == 3
    assert open_l3("memory://") is not open_l3("memory://")  # each its own: nothing is shared
    store = open_l3(f"file://{tmp_path}/pages?max_gb=0.5")
    assert isinstance(store, FileL3)
    assert store.directory == tmp_path / "pages" and store.directory.is_dir()
    assert store.max_bytes == 512 << 20


@pytest.mark.integration
def test_an_unreachable_redis_fails_within_the_timeout(unused_port: int) -> None:
    for url in (f"redis://127.0.0.1:{unused_port}/0", "redis://10.255.255.1:6379/0"):
        started = time.monotonic()
        with pytest.raises(L3Error, match="does not answer"):
            open_l3(url, timeout_s=0.5)
        assert time.monotonic() - started < 1.5, url


@pytest.mark.integration
def test_a_directory_that_cannot_be_made_fails_as_l3_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    with pytest.raises(L3Error, match="cannot create"):
        open_l3(f"file://{tmp_path}/a-file/l3")
