"""A second worker must be able to read what the first one wrote: a writer process puts pages,
this process reads them back byte for byte while the writer still runs.

Mooncake keeps a page in the memory some client lends the store, so what outlives the writer
depends on who lent it: pages in the writer's own segment go with it; pages a lending-nothing
writer (``segment_mb=0``) put into the reader's segment stay."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clairvoyant.worker.core.l3 import L3Store
from clairvoyant.worker.l3 import open_l3
from tests.worker.l3.l3_writer import keys, pages

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRITER = Path(__file__).with_name("l3_writer.py")
MiB = 1 << 20


@contextmanager
def writer(url: str, model: str, count: int, size: int = MiB, seed: int = 11) -> Iterator[int]:
    """A writer process that has put ``count`` pages under ``model`` and stays alive (with its
    store open) until the block ends; yields how many it wrote."""
    process = subprocess.Popen([sys.executable, str(WRITER), url, model, str(count), str(size), str(seed)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline()
        assert line.startswith("wrote "), f"the writer failed (exit {process.wait(30)})"
        yield int(line.split()[1])
    finally:
        process.stdin.close()
        process.wait(30)


@contextmanager
def opened(url: str) -> Iterator[L3Store]:
    store = open_l3(url)
    try:
        yield store
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["file", "redis", "mooncake"])
def test_a_second_worker_reads_what_the_first_wrote(backend: str, request: pytest.FixtureRequest) -> None:
    url: str = request.getfixturevalue(f"{backend}_url")
    model = f"model-{uuid.uuid4().hex[:8]}"
    expected = pages(8, MiB, seed=11)
    with opened(url) as reader, writer(url, model, 8) as wrote:
        assert wrote == 8
        assert reader.exists(keys(model, 8)) == 8
        assert reader.get(keys(model, 8)) == expected
        assert reader.put(keys(model, 8), pages(8, MiB, seed=12)) == 0  # the writer's pages stay


def test_mooncake_pages_go_with_the_writer_that_lent_their_memory(mooncake_url: str) -> None:
    model = f"model-{uuid.uuid4().hex[:8]}"
    with opened(mooncake_url.replace("segment_mb=64", "segment_mb=0")) as reader:
        with writer(mooncake_url, model, 4):
            assert reader.get(keys(model, 4)) == pages(4, MiB, seed=11)
        # the writer has closed: its segment, the only one holding pages, is gone
        assert reader.exists(keys(model, 4)) == 0
        assert reader.get(keys(model, 4)) == [None] * 4


def test_mooncake_pages_in_the_readers_memory_outlive_the_writer(mooncake_url: str) -> None:
    model = f"model-{uuid.uuid4().hex[:8]}"
    with opened(mooncake_url) as reader:  # lends 64 MiB
        with writer(mooncake_url.replace("segment_mb=64", "segment_mb=0"), model, 4) as wrote:
            assert wrote == 4
        assert reader.get(keys(model, 4)) == pages(4, MiB, seed=11)
