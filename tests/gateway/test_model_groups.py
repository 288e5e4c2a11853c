"""Model groups at the gateway: a group name is accepted as the model, its input text goes to the
scheduler, and the answer (records and streamed chunks too) names the served model that ran it."""

from __future__ import annotations

import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, scheduler_pb2
from clairvoyant.core.errors import ModelNotFound
from clairvoyant.core.model_groups import INPUT_TEXT_MAX_CHARS
from clairvoyant.gateway.http_api import GROUP_OWNER
from clairvoyant.gateway.models import ModelCatalog, ServedGroup
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import FakeScheduler, FakeWorker

SMALL, LARGE, GROUP = "m-small", "m-large", "auto"
META = {"workflow_type_id": "self_refine", "workflow_id": "wf-1", "agent_id": "generate"}


class GroupScheduler(FakeScheduler):
    """FakeScheduler with one model group, GROUP = (SMALL, LARGE): a group call goes to the worker
    of ``chosen`` and its placement names that model."""

    chosen = SMALL

    async def Schedule(self, request, context):  # noqa: N802
        if request.model != GROUP:
            placement = await super().Schedule(request, context)
            placement.model = request.model
            return placement
        self.schedule_calls.append(request)
        worker = next(w for w in self.workers if w.model == self.chosen)
        return scheduler_pb2.Placement(
            request_id=request.request_id,
            worker_id=worker.worker_id,
            worker_address=worker.address,
            model=worker.model,
        )

    async def Snapshot(self, request, context):  # noqa: N802
        snapshot = await super().Snapshot(request, context)
        snapshot.groups.append(scheduler_pb2.ModelGroupInfo(name=GROUP, models=[SMALL, LARGE]))
        return snapshot


@pytest.fixture
async def groups_stack(make_stack: StackFactory, monkeypatch: pytest.MonkeyPatch) -> Stack:
    monkeypatch.setattr("tests.gateway.conftest.FakeScheduler", GroupScheduler)
    stack = await make_stack(
        workers=[FakeWorker("small", max_prompt_chars=10_000), FakeWorker("large", max_prompt_chars=10_000)]
    )
    small, large = stack.scheduler.workers
    small.model, small.max_model_len = SMALL, 2048
    large.model, large.max_model_len = LARGE, 8192
    return stack


# ---- the catalog --------------------------------------------------------------------------------


class Snapshots:
    def __init__(self, snapshot: scheduler_pb2.SchedulerSnapshot) -> None:
        self.value = snapshot

    async def snapshot(self, timeout_s: float = 2.0) -> scheduler_pb2.SchedulerSnapshot:
        return self.value


@pytest.mark.unit
async def test_catalog_resolves_a_group_with_its_models_smallest_window() -> None:
    snapshot = scheduler_pb2.SchedulerSnapshot(
        workers=[
            scheduler_pb2.WorkerState(worker_id="a", model=SMALL, max_model_len=4096),
            scheduler_pb2.WorkerState(worker_id="b", model=LARGE, max_model_len=32768),
            scheduler_pb2.WorkerState(worker_id="c", model=LARGE, max_model_len=16384),
        ],
        groups=[
            scheduler_pb2.ModelGroupInfo(name=GROUP, models=[SMALL, LARGE]),
            scheduler_pb2.ModelGroupInfo(name="big-only", models=[LARGE, "m-absent"]),
        ],
    )
    catalog = ModelCatalog(Snapshots(snapshot), ttl_s=0.0)
    assert await catalog.resolve(GROUP) == ServedGroup(GROUP, (SMALL, LARGE), 4096, 3)
    # A member with no worker yet counts for nothing; the rest still bound the window.
    assert await catalog.resolve("big-only") == ServedGroup("big-only", (LARGE, "m-absent"), 16384, 2)
    assert sorted(await catalog.models()) == [LARGE, SMALL]  # groups are not served models
    with pytest.raises(ModelNotFound) as refused:
        await catalog.resolve("nope")
    assert refused.value.message == (
        "the model 'nope' does not exist; available: m-large, m-small; model groups: auto, big-only"
    )


@pytest.mark.unit
async def test_catalog_resolves_a_group_before_any_worker_registers() -> None:
    """The scheduler (not the gateway) then answers that no worker serves it yet."""
    snapshot = scheduler_pb2.SchedulerSnapshot(groups=[scheduler_pb2.ModelGroupInfo(name=GROUP, models=[SMALL])])
    catalog = ModelCatalog(Snapshots(snapshot), ttl_s=0.0)
    assert await catalog.resolve(GROUP) == ServedGroup(GROUP, (SMALL,), 0, 0)
    with pytest.raises(ModelNotFound, match="available: none; model groups: auto"):
        await catalog.resolve("nope")


# ---- through the HTTP and gRPC edges ------------------------------------------------------------


@pytest.mark.integration
async def test_models_lists_groups_as_groups(groups_stack: Stack) -> None:
    cards = {m.id: m for m in (await groups_stack.openai().models.list()).data}
    assert sorted(cards) == [GROUP, LARGE, SMALL]
    assert cards[GROUP].owned_by == GROUP_OWNER and cards[SMALL].owned_by == "clairvoyant"
    assert cards[GROUP].model_extra == {"max_model_len": 2048}  # the smaller of its models' windows


@pytest.mark.integration
async def test_a_group_call_answers_as_the_model_that_ran_it(groups_stack: Stack) -> None:
    client = groups_stack.openai()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "reverse a string"},
        {"role": "assistant", "content": "def f(s): return s"},
        {"role": "user", "content": "now reverse the words"},
    ]
    reply = await client.chat.completions.create(
        model=GROUP, messages=messages, max_tokens=2, extra_body={"app_metadata": META}
    )
    assert reply.model == SMALL
    [scheduled] = groups_stack.scheduler.schedule_calls
    assert (scheduled.model, scheduled.input_text) == (GROUP, "now reverse the words")  # the last user turn
    small, large = groups_stack.workers
    assert [c.model for c in small.calls] == [SMALL] and not large.calls
    record = await groups_stack.records.next()
    assert (record.model, record.worker_id, record.app_metadata.workflow_id) == (SMALL, "small", "wf-1")

    groups_stack.scheduler.chosen = LARGE  # type: ignore[attr-defined]
    chunks = [
        chunk
        async for chunk in await client.chat.completions.create(
            model=GROUP, messages=messages[-1:], max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    ]
    # The role, three deltas, the finish_reason and the usage: every chunk names the served model.
    assert len(chunks) == 6 and {c.model for c in chunks} == {LARGE}
    assert [c.model for c in large.calls] == [LARGE]
    assert (await groups_stack.records.next()).model == LARGE


@pytest.mark.integration
async def test_completions_send_the_prompt_cut_to_the_cap(groups_stack: Stack) -> None:
    prompt = "word " * 1000  # 5000 characters
    reply = await groups_stack.openai().completions.create(model=GROUP, prompt=prompt, max_tokens=1)
    assert reply.model == SMALL
    assert groups_stack.scheduler.schedule_calls[-1].input_text == prompt[:INPUT_TEXT_MAX_CHARS]


@pytest.mark.integration
async def test_a_served_model_call_sends_no_input_text(groups_stack: Stack) -> None:
    reply = await groups_stack.openai().chat.completions.create(
        model=LARGE, messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert reply.model == LARGE
    assert groups_stack.scheduler.schedule_calls[-1].input_text == ""


@pytest.mark.integration
async def test_a_group_call_must_fit_its_smallest_model(groups_stack: Stack) -> None:
    client = groups_stack.openai()
    with pytest.raises(openai.BadRequestError, match="2048"):
        await client.chat.completions.create(
            model=GROUP, messages=[{"role": "user", "content": "hi"}], max_tokens=3000
        )
    reply = await client.chat.completions.create(
        model=LARGE, messages=[{"role": "user", "content": "hi"}], max_tokens=3000
    )
    assert reply.model == LARGE  # the large model alone takes it
    assert [c.model for c in groups_stack.scheduler.schedule_calls] == [LARGE]  # the refusal placed nothing


@pytest.mark.integration
async def test_an_unknown_model_is_404_naming_models_and_groups(groups_stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        await groups_stack.openai().chat.completions.create(
            model="qwen-auto", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.code == "model_not_found"
    assert "available: m-large, m-small; model groups: auto" in refused.value.message


@pytest.mark.integration
async def test_grpc_chunks_name_the_served_model(groups_stack: Stack) -> None:
    async with grpc.aio.insecure_channel(groups_stack.grpc_address) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        request = gateway_pb2.ChatCompletionRequest(
            model=GROUP, messages=[common_pb2.ChatMessage(role="user", content="plan the trip")]
        )
        chunks = [c async for c in stub.ChatCompletionStream(request)]
        reply = await stub.ChatCompletion(request)
    assert {c.model for c in chunks} == {SMALL} and len(chunks) == 5
    assert reply.model == SMALL
    assert [c.input_text for c in groups_stack.scheduler.schedule_calls] == ["plan the trip"] * 2
