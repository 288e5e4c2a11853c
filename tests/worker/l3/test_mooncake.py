"""What Mooncake Store adds to the contract: read leases, a bounded transfer buffer, and a master
that can go away."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clairvoyant.stack.mooncakemaster import MooncakeMaster
from clairvoyant.worker.core.l3 import L3Error, page_key
from clairvoyant.worker.l3 import open_l3
from clairvoyant.worker.l3.mooncake_store import MooncakeL3
from tests.worker.l3.conftest import MOONCAKE_CLIENT, MOONCAKE_LEASE_MS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MiB = 1 << 20


@pytest.fixture(scope="module")
def store(mooncake_url: str) -> Iterator[MooncakeL3]:
    opened = open_l3(mooncake_url)
    assert isinstance(opened, MooncakeL3)
    try:
        yield opened
    finally:
        opened.close()


def fresh_keys(count: int) -> list[str]:
    model = f"model-{uuid.uuid4().hex[:8]}"
    return [page_key(model, None, block_hash) for block_hash in range(count)]


def test_a_page_just_read_is_kept_until_its_lease_ends(store: MooncakeL3) -> None:
    [key] = fresh_keys(1)
    store.put([key], [b"page"])
    assert store.get([key]) == [b"page"]
    leased_before = store.leased_on_remove
    assert store.remove([key]) == 0  # a reader's lease holds it
    assert store.leased_on_remove == leased_before + 1
    time.sleep(MOONCAKE_LEASE_MS / 1000 + 0.3)
    assert store.remove([key]) == 1
    assert store.exists([key]) == 0


def test_a_page_larger_than_the_transfer_buffer_is_refused(store: MooncakeL3) -> None:
    [key] = fresh_keys(1)
    with pytest.raises(L3Error, match="buffer_mb"):
        store.put([key], [bytes(15 * MiB)])  # the clients here have a 16 MiB buffer, 90 % usable
    assert store.exists([key]) == 0


def test_an_empty_page_is_refused(store: MooncakeL3) -> None:
    with pytest.raises(ValueError, match="empty"):
        store.put(fresh_keys(1), [b""])


def test_reads_resplit_when_pages_are_larger_than_the_last_ones(store: MooncakeL3, mooncake_url: str) -> None:
    """A client sizes its read batches by the largest page it has seen; pages larger than that
    overflow the buffer at first and are fetched again in smaller batches."""
    small, big = fresh_keys(1), fresh_keys(3)
    big_pages = [bytes([n]) * (6 * MiB) for n in range(3)]  # 18 MiB: more than one buffer
    store.put(small, [b"s" * 4096])
    store.put(big, big_pages)
    reader = open_l3(mooncake_url)
    try:
        assert reader.get(small) == [b"s" * 4096]  # it now plans for 4 KiB pages
        assert reader.get(big) == big_pages
    finally:
        reader.close()


CLIENT = """
import sys, time
from clairvoyant.worker.core.l3 import L3Error
from clairvoyant.worker.l3 import open_l3
store = open_l3(sys.argv[1], timeout_s=2.0)
print(store.put(["k1"], [b"x" * 1000]), flush=True)
sys.stdin.readline()  # the master is gone now
for name, call in (("put", lambda: store.put(["k2"], [b"y"])), ("get", lambda: store.get(["k1"])),
                   ("exists", lambda: store.exists(["k1"])), ("remove", lambda: store.remove(["k1"]))):
    started = time.monotonic()
    try:
        call()
        outcome = "returned"
    except L3Error:
        outcome = "L3Error"
    print(name, outcome, round(time.monotonic() - started, 2), flush=True)
"""


def test_a_lost_master_fails_calls_within_the_timeout(mooncake_available: None, tmp_path: Path) -> None:
    """In a client process of its own: closing a client whose master is gone takes Mooncake
    6-15 s (module docstring), which this test does not wait for."""
    master = MooncakeMaster(log_path=tmp_path / "master.log").start()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, master.l3_url + MOONCAKE_CLIENT],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    try:
        assert client.stdout.readline().strip() == "1"
        master.stop()
        time.sleep(0.5)
        client.stdin.write("go\n")
        client.stdin.flush()
        lines = [client.stdout.readline().split() for _ in range(4)]
    finally:
        master.stop()
        client.kill()
        client.wait()
    assert [(name, outcome) for name, outcome, _ in lines] == [
        ("put", "L3Error"), ("get", "L3Error"), ("exists", "L3Error"), ("remove", "L3Error")]
    # About one timeout (2 s) each; the bound leaves room for a loaded machine (4.3 s seen under a
    # full parallel run) and still catches what this guards against: a call that hangs.
    assert all(float(seconds) < 3 * 2.0 for _, _, seconds in lines), lines


def test_an_unreachable_master_fails_the_open_within_the_timeout(mooncake_master: MooncakeMaster,
                                                                 unused_port: int) -> None:
    for url in (f"mooncake://127.0.0.1:{unused_port}",  # refused
                f"mooncake://{mooncake_master.address}?metadata=http://127.0.0.1:{unused_port}/metadata",
                "mooncake://10.255.255.1:50051"):  # not routed: nothing answers
        started = time.monotonic()
        with pytest.raises(L3Error, match="does not answer"):
            open_l3(url, timeout_s=0.5)
        assert time.monotonic() - started < 1.5, url
