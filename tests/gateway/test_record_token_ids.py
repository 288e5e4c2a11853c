"""The CompletionRecord carries what the cache manager keeps as workflow history: the prompt's token
ids (from the worker's last message), the output's (from the stream) and the annotations the
request was served with; ``CV_GATEWAY_RECORD_TOKEN_IDS=false`` leaves the token ids out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from clairvoyant.contracts.v1 import common_pb2, worker_pb2
from tests.gateway.conftest import StackFactory
from tests.gateway.fakes import ANNOTATIONS, MODEL, TOKENS, FakeProfiler, FakeWorker, prompt_text

pytestmark = pytest.mark.integration

META = {"workflow_type_id": "coding_assistant", "workflow_id": "session-9", "agent_id": "planner"}
CHAT = [{"role": "user", "content": "plan the refactoring"}]


@dataclass
class PromptEchoingWorker(FakeWorker):
    """A FakeWorker whose last message also carries the prompt's token ids (its bytes), as the
    real worker's does."""

    async def Generate(self, request, context) -> AsyncIterator[worker_pb2.GenerateResponse]:  # noqa: N802
        async for reply in super().Generate(request, context):
            if reply.HasField("finish_reason"):
                reply.prompt_token_ids.extend(prompt_text(request).encode())
            yield reply


async def post_chat(url: str) -> None:
    body = {"model": MODEL, "messages": CHAT, "app_metadata": META}
    async with httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


async def test_the_record_carries_token_ids_and_annotations(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[PromptEchoingWorker()], profiler=FakeProfiler(), profiler_timeout_s=5.0)
    await post_chat(stack.url)
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_OK
    assert list(record.prompt_token_ids) == list(CHAT[0]["content"].encode())
    assert list(record.output_token_ids) == [100 + i for i in range(len(TOKENS))]
    assert record.HasField("annotations")
    assert record.annotations == ANNOTATIONS
    assert record.app_metadata.workflow_id == "session-9"


async def test_token_ids_can_be_left_out(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[PromptEchoingWorker()], gateway_record_token_ids=False)
    await post_chat(stack.url)
    record = await stack.records.next()
    assert (list(record.prompt_token_ids), list(record.output_token_ids)) == ([], [])
    assert record.output_tokens == len(TOKENS)  # the counts stay
    assert not record.HasField("annotations")  # no profiler: served without annotations


async def test_a_failed_stream_records_the_output_it_carried(make_stack: StackFactory) -> None:
    stack = await make_stack(workers=[PromptEchoingWorker(fail_after=2)])
    async with httpx.AsyncClient(base_url=stack.url) as http:
        await http.post("/v1/chat/completions", json={"model": MODEL, "messages": CHAT})
    record = await stack.records.next()
    assert record.status == common_pb2.REQUEST_STATUS_ERROR
    assert list(record.output_token_ids) == [100, 101]
    assert list(record.prompt_token_ids) == []  # the last message never came
