"""The ``file://`` store beyond the contract: safe names, whole pages under concurrency, and the
least-recently-used cap shared by every process on the directory."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path

import pytest

from clairvoyant.worker.l3.file_store import FileL3

pytestmark = pytest.mark.integration

PAGE = 1000


def counter_clock() -> itertools.count[int]:
    return itertools.count(1)


def test_any_key_becomes_a_short_name_inside_the_directory(tmp_path: Path) -> None:
    store = FileL3(tmp_path / "l3")
    keys = ["../../etc/passwd", "a/b/c", "x" * 5000, "", "naïve key\n\x00"]
    pages = [bytes([n]) * 10 for n in range(len(keys))]
    assert store.put(keys, pages) == len(keys)
    assert store.get(keys) == pages
    files = [path for path in (tmp_path / "l3").rglob("*") if path.is_file()]
    assert len(files) == len(keys)
    assert all(path.parent.parent == tmp_path / "l3" and len(path.name) == 32 + len(".page") for path in files)


def test_the_least_recently_used_pages_go_first_beyond_the_cap(tmp_path: Path) -> None:
    clock = counter_clock()
    store = FileL3(tmp_path, max_bytes=3 * PAGE, clock_ns=lambda: next(clock))
    store.put(["p0", "p1", "p2"], [b"0" * PAGE, b"1" * PAGE, b"2" * PAGE])  # exactly the cap
    assert store.get(["p0"]) == [b"0" * PAGE]  # p0 is now the most recently used
    store.put(["p3"], [b"3" * PAGE])  # over the cap: down to 90 % of it, oldest first
    assert store.get(["p0", "p1", "p2", "p3"]) == [b"0" * PAGE, None, None, b"3" * PAGE]
    assert store.evicted == 2


def test_the_cap_counts_pages_other_processes_wrote(tmp_path: Path) -> None:
    clock = counter_clock()
    uncapped = FileL3(tmp_path, clock_ns=lambda: next(clock))
    uncapped.put([f"p{n}" for n in range(4)], [bytes(PAGE)] * 4)
    capped = FileL3(tmp_path, max_bytes=3 * PAGE)  # it looks at the directory when it opens
    assert capped.evicted == 2
    assert uncapped.get([f"p{n}" for n in range(4)]) == [None, None, bytes(PAGE), bytes(PAGE)]


def test_readers_never_see_part_of_a_page(tmp_path: Path) -> None:
    store = FileL3(tmp_path)
    keys = [f"k{n}" for n in range(60)]
    pages = [random.Random(n).randbytes(256 * 1024) for n in range(60)]
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.extend(page for page in store.get(keys) if page is not None)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for key, page in zip(keys, pages, strict=True):
            store.put([key], [page])
    finally:
        done.set()
        reader.join()
    expected = set(pages)
    assert seen and all(page in expected for page in seen)
    assert not [path for path in tmp_path.rglob(".*") if path.is_file()]  # no temporary files left


def test_of_two_writers_racing_on_a_key_exactly_one_wins(tmp_path: Path) -> None:
    first, second = FileL3(tmp_path), FileL3(tmp_path)  # as two processes would: no shared state
    keys = [f"k{n}" for n in range(200)]
    written = {}
    start = threading.Barrier(2)

    def write(name: str, store: FileL3, fill: bytes) -> None:
        start.wait()
        written[name] = store.put(keys, [fill * 4096] * len(keys))

    threads = [threading.Thread(target=write, args=("first", first, b"a")),
               threading.Thread(target=write, args=("second", second, b"b"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert written["first"] + written["second"] == len(keys)
    assert all(page in (b"a" * 4096, b"b" * 4096) for page in first.get(keys))
