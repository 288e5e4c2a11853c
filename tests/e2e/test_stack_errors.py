"""Refusals and failures on the real stack: right status, OpenAI error shape, no record."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import httpx
import pytest
from openai import OpenAI

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.stack import Stack
from tests.e2e.test_stack_openai import MODEL, records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
META = {"workflow_type_id": "errors", "workflow_id": "wf-refused", "agent_id": "a"}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}, 404, "model_not_found"),
        # tiny-random's window is 2,048 tokens; the real worker counts the tokens and refuses.
        ({"model": MODEL, "messages": [{"role": "user", "content": "y" * 2100}], "max_tokens": 8}, 400,
         "context_length_exceeded"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
          "app_metadata": {"workflow_type_id": "t", "workflow_id": "bad id", "agent_id": "a"}}, 400, None),
        ({"model": MODEL, "messages": []}, 400, None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 9}, 400, None),
    ],
)
def test_refused_requests_publish_nothing(stack: Stack, body: dict[str, object], status: int, code: str | None) -> None:
    before = len(asyncio.run(records(stack, 0, timeout=0)))
    response = httpx.post(f"{stack.gateway_url}/v1/chat/completions", json={**body, "app_metadata": body.get(
        "app_metadata", META)}, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] in ("invalid_request_error", "not_found_error")
    if code is not None:
        assert error["code"] == code
    time.sleep(0.3)
    assert len(asyncio.run(records(stack, 0, timeout=0))) == before
    snapshot = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(stack.scheduler_address)).Snapshot(
        scheduler_pb2.SnapshotRequest())
    assert all(w.placed == 0 for w in snapshot.workers)  # nothing left holding capacity


def test_a_killed_worker_is_removed_and_requests_keep_completing(stack: Stack) -> None:
    """Runs last in this module: it kills worker-2 for good."""
    victim = dict(stack.children)["worker-2"]
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=60)
    started = time.monotonic()
    # Until the scheduler expires worker-2 (3 missed heartbeats), placements on it fail before the
    # first token and the gateway re-places them once on another worker: no request fails.
    for i in range(6):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"after kill {i}"}], max_tokens=3,
            extra_body={"ignore_eos": True, "app_metadata": {**META, "workflow_id": "wf-after-kill"}})
        assert reply.usage is not None and reply.usage.completion_tokens == 3
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(stack.scheduler_address))
    while time.monotonic() - started < 10:
        workers = [w.worker_id for w in stub.Snapshot(scheduler_pb2.SnapshotRequest()).workers]
        if workers == ["worker-1"]:
            break
        time.sleep(0.2)
    assert workers == ["worker-1"]
    done = asyncio.run(records(stack, 6, workflow_id="wf-after-kill"))
    assert len(done) == 6 and {r.worker_id for r in done} == {"worker-1"}
