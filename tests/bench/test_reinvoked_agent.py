"""The re-invoked agent benchmark's emulated setup, in virtual time: a context staged in L2 or L3
gives a lower TTFT than recomputing it, and the engine reports where the context came from."""

from __future__ import annotations

import pytest

from clairvoyant.bench.reinvoked_agent import emulated_setup, one_case

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_staged_context_beats_recompute_in_virtual_time() -> None:
    setup = emulated_setup("qwen2.5-14b", "H100-80G", 1000)
    recompute, l2, l3 = (one_case(setup, case, repeat=0) for case in ("recompute", "L2", "L3"))
    assert recompute[1] == 0 and l2[1] == l3[1] == 992  # whole blocks of the 1,000-token context
    assert l2[0] < l3[0] < recompute[0]
    assert one_case(setup, "L2", repeat=0) == l2  # virtual time: exact
