"""A second worker, as far as the L3 is concerned: ``python l3_writer.py URL MODEL COUNT SIZE SEED``
opens the store, writes COUNT pages of SIZE random bytes (``pages(...)``) under MODEL, prints
``wrote N``, and keeps the store open until its standard input closes."""

from __future__ import annotations

import random
import sys

from clairvoyant.worker.core.l3 import page_key
from clairvoyant.worker.l3 import open_l3


def keys(model: str, count: int) -> list[str]:
    return [page_key(model, "tenant", block_hash) for block_hash in range(1, count + 1)]


def pages(count: int, size: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def main(url: str, model: str, count: int, size: int, seed: int) -> None:
    store = open_l3(url)
    try:
        written = store.put(keys(model, count), pages(count, size, seed))
        print(f"wrote {written}", flush=True)
        sys.stdin.read()  # the reader says when it is done by closing our input
    finally:
        store.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
