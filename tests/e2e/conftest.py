"""A whole stack (NATS, scheduler, profiler, two tiny-random workers, gateway) started once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clairvoyant.stack import Stack, StackConfig


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack")
    config = StackConfig.on_free_ports(
        var,
        model="tiny-random",
        workers=2,
        # Small pools so the tests see real preemption/occupancy numbers; one thread each on 2 cores.
        worker_env={"CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "256", "CV_MAX_NUM_SEQS": "16"},
    )
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()
