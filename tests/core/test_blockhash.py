"""Chained block hashes: prefix identity, chain continuation, and the record's prompt/response split."""

from __future__ import annotations

import pytest

from clairvoyant.core.blockhash import BLOCK_TOKENS, chain_hashes, sequence_hashes


def test_only_full_blocks_are_hashed_and_values_are_stable() -> None:
    assert chain_hashes(list(range(15))) == []
    one = chain_hashes(list(range(16)))
    assert len(one) == 1 and 0 <= one[0] < 2**64
    assert chain_hashes(list(range(40)))[:1] == one and len(chain_hashes(list(range(40)))) == 2
    assert chain_hashes(list(range(16))) == one  # deterministic across calls (no per-process salt)


def test_a_block_hash_depends_on_everything_before_it() -> None:
    a = list(range(48))
    b = [999] + a[1:]  # differs only in the first token
    ha, hb = chain_hashes(a), chain_hashes(b)
    assert all(x != y for x, y in zip(ha, hb, strict=True))
    c = a[:32] + [7] * 16  # shares the first two blocks
    assert chain_hashes(c)[:2] == ha[:2] and chain_hashes(c)[2] != ha[2]


def test_a_chain_continues_from_a_previous_hash() -> None:
    tokens = list(range(64))
    whole = chain_hashes(tokens)
    assert chain_hashes(tokens[32:], previous=whole[1]) == whole[2:]


def test_response_chain_continues_the_prompt_over_the_whole_sequence() -> None:
    prompt, output = list(range(37)), list(range(100, 130))  # 2 full prompt blocks, 67 tokens in all
    p, r = sequence_hashes(prompt, output)
    assert p == chain_hashes(prompt) and len(p) == 2
    assert p + r == chain_hashes(prompt + output) and len(r) == 67 // BLOCK_TOKENS - 2
    # A follow-up prompt that continues the conversation shares every one of those blocks.
    follow_up = prompt + output + [5] * 20
    assert chain_hashes(follow_up)[: len(p + r)] == p + r


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        chain_hashes([1, 2, 3], block_tokens=0)
