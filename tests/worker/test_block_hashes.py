"""SequenceHasher: the worker's off-the-loop way of computing ``sequence_hashes``."""

from __future__ import annotations

import asyncio

import pytest

from clairvoyant.core.blockhash import BLOCK_TOKENS, sequence_hashes
from clairvoyant.worker.block_hashes import INLINE_BLOCKS, SequenceHasher

pytestmark = pytest.mark.unit

# Prompt lengths around every boundary: empty, partial block, exact blocks, the inline/thread cut.
PROMPT_LENGTHS = [0, 1, 15, 16, 17, 40, INLINE_BLOCKS * BLOCK_TOKENS - 1, INLINE_BLOCKS * BLOCK_TOKENS + 5]


@pytest.mark.parametrize("prompt_len", PROMPT_LENGTHS)
@pytest.mark.parametrize("output_len", [0, 1, 16, 33, INLINE_BLOCKS * BLOCK_TOKENS + 7])
async def test_equals_sequence_hashes(prompt_len: int, output_len: int) -> None:
    prompt = [(31 * i + 7) % 50_000 for i in range(prompt_len)]
    output = [(17 * i + 2) % 50_000 for i in range(output_len)]
    hasher = SequenceHasher(prompt)
    assert await hasher.finish(output) == sequence_hashes(prompt, output)
    hasher.cancel()  # after finish: a no-op


async def test_cancel_before_finish_leaves_no_pending_task() -> None:
    hasher = SequenceHasher(list(range(INLINE_BLOCKS * BLOCK_TOKENS * 4)))  # long: hashed on a thread
    hasher.cancel()
    await asyncio.sleep(0)
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert pending == []
