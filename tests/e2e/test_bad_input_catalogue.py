"""The gateway's whole catalogue of bad input against the real stack: each body refused with the
right OpenAI error, nothing left placed, nothing recorded, and the stack still serving."""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
import pytest
from openai import OpenAI

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.stack import Stack
from tests.e2e.test_stack_openai import MODEL, records
from tests.gateway.test_bad_input import assert_openai_error, catalogue

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
META = {"workflow_type_id": "errors", "workflow_id": "wf-after-catalogue", "agent_id": "a"}


def placed(stack: Stack) -> dict[str, int]:
    with grpc.insecure_channel(stack.scheduler_address) as channel:
        snapshot = scheduler_pb2_grpc.SchedulerStub(channel).Snapshot(
            scheduler_pb2.SnapshotRequest(), timeout=5
        )
    return {w.worker_id: w.placed for w in snapshot.workers}


def test_the_catalogue_is_refused_and_the_stack_serves_on(stack: Stack) -> None:
    cases = catalogue(MODEL)
    recorded_before = len(asyncio.run(records(stack, 0, timeout=0)))
    wrong = []
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as http:
        for case in cases:
            response = http.post(
                case.path, content=case.content(), headers={"content-type": "application/json"}
            )
            try:
                assert_openai_error(response, case)
            except AssertionError as exc:
                wrong.append(f"{case.name}: {exc}")
    assert wrong == []
    past_the_limits = {
        "nesting_too_deep",
        "request_too_large",
        "array_above_max_length",
        "string_above_max_length",
    }
    assert past_the_limits | {"invalid_encoding"} <= {case.code for case in cases}
    assert placed(stack) == {"worker-1": 0, "worker-2": 0}  # no refusal holds a placement
    time.sleep(0.3)
    assert len(asyncio.run(records(stack, 0, timeout=0))) == recorded_before

    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=60)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "still here? \U0001f600"}],
        max_tokens=3,
        extra_body={"ignore_eos": True, "app_metadata": META},
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    text = client.completions.create(
        model=MODEL, prompt="and here", max_tokens=2, extra_body={"ignore_eos": True, "app_metadata": META}
    )
    assert text.usage is not None and text.usage.completion_tokens == 2
    assert len(asyncio.run(records(stack, 2, workflow_id=META["workflow_id"]))) == 2
    deadline = time.monotonic() + 10  # the release follows the reply
    while sum(placed(stack).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert placed(stack) == {"worker-1": 0, "worker-2": 0}
