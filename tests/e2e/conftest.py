"""A whole stack (NATS, scheduler, two tiny-random workers, gateway) started once per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clairvoyant.core.natsserver import free_port
from clairvoyant.core.stack import Stack, StackConfig


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack")
    config = StackConfig(
        var_dir=var,
        model="tiny-random",
        workers=2,
        gateway_port=free_port(),
        gateway_grpc_port=free_port(),
        scheduler_port=free_port(),
        scheduler_metrics_port=free_port(),
        worker_grpc_base=free_port(),
        worker_http_base=free_port(),
        env={"CV_LOG_LEVEL": "WARNING", "CV_DATABASE_URL": f"sqlite:///{var / 'gateway.db'}"},
        # Small pools so the tests see real preemption/occupancy numbers; one thread each on 2 cores.
        worker_env={"CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "256", "CV_MAX_NUM_SEQS": "16"},
    )
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()
