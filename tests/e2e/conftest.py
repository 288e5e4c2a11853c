"""A whole stack (NATS, scheduler, profiler, two tiny-random workers, gateway) started once per module."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import nats
import pytest

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.bus import COMPLETIONS_STREAM, COMPLETIONS_SUBJECT
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


async def records(
    stack: Stack,
    expect: int,
    timeout: float = 10.0,
    workflow_id: str | None = None,
    request_ids: Collection[str] | None = None,
) -> list[common_pb2.CompletionRecord]:
    """The completion records on the stack's JetStream stream (only ``workflow_id``'s, or those of
    ``request_ids``, when given), once at least ``expect`` of them exist or ``timeout`` passes.  The gateway publishes a
    record after its reply, so a test waits for the records it counts, not for the stream's total
    (which earlier tests' records may already reach)."""
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        while True:
            info = await js.stream_info(COMPLETIONS_STREAM)
            sub = await js.subscribe(COMPLETIONS_SUBJECT, ordered_consumer=True)
            out = []
            for _ in range(info.state.messages):
                record = common_pb2.CompletionRecord.FromString((await sub.next_msg(timeout=5)).data)
                if (workflow_id is None or record.app_metadata.workflow_id == workflow_id) and (
                    request_ids is None or record.request_id in request_ids
                ):
                    out.append(record)
            await sub.unsubscribe()
            if len(out) >= expect or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
