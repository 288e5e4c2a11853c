"""URLs of real L3 stores for the backend tests, one per test module.

``file_url``: a fresh directory.  ``redis_url``: the Redis on 127.0.0.1:6379 (pre-started on the
development machines and in CI) under a key prefix of its own, removed afterwards; skipped only
when nothing answers there.  ``mooncake_url``: a ``mooncake_master`` started for the session on
free ports.  Mooncake needs the worker's ``mooncake`` extra and Debian's libibverbs1 (``make
install`` installs both): without them its tests are skipped, except under ``CI``, where they fail
so that CI cannot pass without running them.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest

from clairvoyant.stack.mooncakemaster import MooncakeMaster, find_mooncake_master
from clairvoyant.worker.core.l3 import L3Error
from clairvoyant.worker.l3.mooncake_store import load_store_class

REDIS_ADDRESS = ("127.0.0.1", 6379)
MOONCAKE_LEASE_MS = 1000  # the master's read lease (10 s by default), short so tests can outwait it
MOONCAKE_CLIENT = "&segment_mb=64&buffer_mb=16"  # each test's client lends 64 MiB


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def mooncake_missing() -> str | None:
    """Why Mooncake cannot run here, or None."""
    try:
        load_store_class()
        find_mooncake_master()
    except (L3Error, FileNotFoundError) as exc:
        return f"Mooncake Store is not usable here: {exc}"
    return None


def answers(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def file_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('l3')}"


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A namespace of its own on the local Redis (keys expire within 10 minutes even if the
    clean-up below never runs)."""
    if not answers(REDIS_ADDRESS):
        pytest.skip("no Redis answers on 127.0.0.1:6379")
    import redis

    prefix = f"cv-test-{uuid.uuid4().hex}/"
    yield f"redis://127.0.0.1:6379/0?prefix={prefix}&ttl_s=600"
    client = redis.Redis(*REDIS_ADDRESS)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.unlink(*keys)
    finally:
        client.close()


@pytest.fixture(scope="session")
def mooncake_available() -> None:
    """Skips the test when Mooncake cannot run here; fails it instead under CI."""
    missing = mooncake_missing()
    if missing:
        if in_ci():
            pytest.fail(f"CI must run the Mooncake tests: {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="session")
def mooncake_master(mooncake_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeMaster]:
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    master = MooncakeMaster(log_path=log, extra_args=(f"--default_kv_lease_ttl={MOONCAKE_LEASE_MS}",)).start()
    try:
        yield master
    finally:
        master.stop()


@pytest.fixture(scope="module")
def mooncake_url(mooncake_master: MooncakeMaster) -> str:
    return mooncake_master.l3_url + MOONCAKE_CLIENT


@pytest.fixture(scope="module", params=["memory", "file", "redis", "mooncake"])
def l3_url(request: pytest.FixtureRequest) -> str:
    """Each backend's URL in turn.  Module-scoped, as the stores opened on them are (closing a
    Mooncake client takes seconds): tests keep apart by writing under models of their own."""
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
