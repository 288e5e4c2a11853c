"""The ``L3Store`` contract, held by every backend: memory, file, Redis and Mooncake Store."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest

from clairvoyant.worker.core.l3 import L3Store, page_key
from clairvoyant.worker.l3 import open_l3

pytestmark = pytest.mark.integration

MiB = 1 << 20


@pytest.fixture(scope="module")
def store(l3_url: str) -> Iterator[L3Store]:
    opened = open_l3(l3_url)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def model() -> str:
    """A model name of this test's own: tests sharing a Redis or a Mooncake master never meet."""
    return f"model-{uuid.uuid4().hex[:8]}"


def keys_of(model: str, count: int, tenant: str | None = "tenant") -> list[str]:
    return [page_key(model, tenant, block_hash) for block_hash in range(1, count + 1)]


def pages_of(count: int, size: int = 4096, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def test_it_is_an_l3_store_named_by_its_scheme(store: L3Store, l3_url: str) -> None:
    assert isinstance(store, L3Store)
    assert store.name == l3_url.split(":", 1)[0]


def test_exists_counts_the_leading_run_and_stops_at_the_first_gap(store: L3Store, model: str) -> None:
    keys = keys_of(model, 5)
    pages = pages_of(5)
    assert store.put([keys[0], keys[1], keys[3], keys[4]], [pages[0], pages[1], pages[3], pages[4]]) == 4
    assert store.exists(keys) == 2  # keys[2] is missing: keys[3:] do not count
    assert store.exists(keys[3:]) == 2
    assert store.exists(keys[2:]) == 0
    assert store.exists([]) == 0


def test_get_returns_none_where_a_page_is_missing(store: L3Store, model: str) -> None:
    keys = keys_of(model, 3)
    pages = pages_of(3)
    store.put([keys[0], keys[2]], [pages[0], pages[2]])
    assert store.get(keys) == [pages[0], None, pages[2]]
    assert store.get([keys[1]]) == [None]
    assert store.get([]) == []


def test_put_writes_only_absent_pages_and_counts_them(store: L3Store, model: str) -> None:
    keys = keys_of(model, 3)
    first, second = pages_of(3, seed=1), pages_of(3, seed=2)
    assert store.put(keys[:2], first[:2]) == 2
    assert store.put(keys, second) == 1  # only keys[2] was absent
    assert store.get(keys) == [first[0], first[1], second[2]]  # present pages are not overwritten
    assert store.put(keys, second) == 0


def test_put_needs_one_page_per_key(store: L3Store, model: str) -> None:
    with pytest.raises(ValueError):
        store.put(keys_of(model, 2), pages_of(1))


def test_a_one_mib_page_round_trips_byte_exact(store: L3Store, model: str) -> None:
    keys = keys_of(model, 3)
    pages = [random.Random(7).randbytes(MiB), bytes(range(256)) * 16, b"\x00" * 100 + b"\xff"]
    assert store.put(keys, pages) == 3
    got = store.get(keys)
    assert [len(page or b"") for page in got] == [MiB, 4096, 101]
    assert got == pages


def test_more_pages_than_one_round_trip_carries(store: L3Store, model: str) -> None:
    """300 pages of 64 KiB: more keys than a Redis pipeline and more bytes than a 16 MiB Mooncake
    buffer take at once."""
    keys = keys_of(model, 300)
    pages = pages_of(300, size=64 * 1024, seed=3)
    assert store.put(keys, pages) == 300
    assert store.exists(keys) == 300
    assert store.get(keys) == pages


def test_models_and_tenants_never_see_each_others_pages(store: L3Store, model: str) -> None:
    other_model = model + "-b"
    namespaces = [(model, "alice"), (model, "bob"), (model, None), (other_model, "alice"),
                  (model, "alice/x"), (f"{model}/alice", "x")]  # a "/" cannot forge a namespace
    keys = [page_key(name, tenant, 42) for name, tenant in namespaces]
    assert len(set(keys)) == len(keys)
    pages = pages_of(len(keys), seed=4)
    assert store.put(keys[:1], pages[:1]) == 1
    for key in keys[1:]:
        assert store.exists([key]) == 0
        assert store.get([key]) == [None]
    assert store.put(keys, pages) == len(keys) - 1
    assert store.get(keys) == pages


def test_remove_deletes_what_is_present_and_counts_it(store: L3Store, model: str) -> None:
    keys = keys_of(model, 4)
    pages = pages_of(4, seed=5)
    store.put(keys[:3], pages[:3])
    assert store.remove([keys[0], keys[1], keys[3]]) == 2  # keys[3] was never there
    # Only removed keys are looked at before the next remove: a lookup of a present page makes
    # Mooncake keep it for a lease (test_mooncake.py).
    assert store.exists(keys[:2]) == 0
    assert store.remove(keys) == 1
    assert store.get(keys) == [None, None, None, None]
    assert store.remove([]) == 0
    assert store.put(keys[:1], pages[:1]) == 1  # a removed key can be written again
