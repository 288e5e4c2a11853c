"""The scheduler core's rule for waiting on a KV move, which the simulator applies too."""

from __future__ import annotations

import pytest

from clairvoyant.scheduler.core.migration import worth_moving

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("saved_tokens", "transfer_s", "recompute_s", "expected"),
    [
        (0, 0.001, 0.0, False),  # nothing to save: never wait
        (512, 0.010, 0.020, True),  # the transfer is shorter than recomputing
        (512, 0.020, 0.020, False),  # a tie: start at once
        (512, 0.050, 0.020, False),  # the transfer is longer
    ],
)
def test_waits_only_for_a_transfer_shorter_than_the_recompute_it_saves(
    saved_tokens: int, transfer_s: float, recompute_s: float, expected: bool
) -> None:
    assert worth_moving(saved_tokens, transfer_s, recompute_s) is expected
