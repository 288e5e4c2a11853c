"""Chained block hashes: the identity of a KV block as the radix cache sees it.

A prompt is cut into full ``BLOCK_TOKENS``-token blocks (a partial tail block has no hash).  Block
``i``'s hash covers its own tokens and, through the previous hash, every token before it, so two
sequences share block ``i``'s hash exactly when they share their first ``(i + 1) * BLOCK_TOKENS``
tokens: the condition under which the radix cache can reuse that block's K/V.

    h[-1] = 0
    h[i]  = blake2b-64( h[i-1] as 8 little-endian bytes || tokens[16i : 16i+16] as uint32 LE )

Completion records carry the prompt's chain and the response's chain.  The response chain continues
the prompt's over the whole sequence (prompt tokens then output tokens): its first block is the one
holding the prompt's partial tail and the first output tokens.  ``prompt + response`` is therefore the
chain of every full block the finished sequence leaves in the cache.  Hashes are unsigned 64-bit
integers (protobuf ``fixed64``); the profiler compares them and never sees text.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BLOCK_TOKENS = 16


def chain_hashes(token_ids: Sequence[int], previous: int = 0, block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Hashes of the full blocks of ``token_ids``, chained from ``previous`` (0 at a sequence start)."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    hashes: list[int] = []
    full = len(token_ids) - len(token_ids) % block_tokens
    for start in range(0, full, block_tokens):
        previous = next_hash(previous, token_ids[start : start + block_tokens])
        hashes.append(previous)
    return hashes


def next_hash(previous: int, block: Sequence[int]) -> int:
    """The hash of one full block whose predecessor's hash is ``previous`` (0 for the first)."""
    digest = hashlib.blake2b(previous.to_bytes(8, "little"), digest_size=8)
    digest.update(array("I", block).tobytes())
    return int.from_bytes(digest.digest(), "little")


def sequence_hashes(
    prompt_ids: Sequence[int], output_ids: Sequence[int], block_tokens: int = BLOCK_TOKENS
) -> tuple[list[int], list[int]]:
    """The (prompt, response) chains of a finished sequence, as completion records carry them."""
    prompt = chain_hashes(prompt_ids, 0, block_tokens)
    tail = len(prompt) * block_tokens
    rest = list(prompt_ids[tail:]) + list(output_ids)
    response = chain_hashes(rest, prompt[-1] if prompt else 0, block_tokens)
    return prompt, response


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Blocks two chains share (binary search: chained hashes agree on a prefix, then never again)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
