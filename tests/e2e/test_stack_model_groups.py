"""Model groups end to end (Aragog, seeds/002): a stack with emulated Qwen-2.5 7B, 14B and 32B workers,
the ``aragog`` preset and a group over the three, driven with the official openai SDK.

Self-refine workflows (generate -> critique -> refine, each call naming its parent) run
concurrently on workers of two slots each, so that the largest model's slots fill and the
scheduler spreads stages over the models the table router allows (it declares every configuration
accurate for these inputs).  Each answer's ``model`` is checked against the worker that ran it
(from the completion records: a worker refuses a call for any model but its own).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import AsyncOpenAI, NotFoundError, OpenAI

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.policy.aragog.routers import InputClass, TableRouter, ngram_weights
from clairvoyant.stack import Stack, StackConfig
from tests.e2e.conftest import records

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODELS = ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b")  # cheapest first; the last is the reference
GROUP = "qwen2.5-auto"
AGENTS = ("generate", "critique", "refine")
TASK = "Write a Python function to reverse the words of a sentence."
WORKFLOWS = 8
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack-model-groups")
    everything = tuple("+".join(models) for models in itertools.product(MODELS, repeat=len(AGENTS)))
    table = TableRouter("self_refine", [InputClass("coding", everything, ngram_weights(TASK))])
    (var / "self_refine.json").write_text(json.dumps(table.to_dict()))
    groups = var / "model-groups.yaml"
    groups.write_text(
        f"groups:\n  {GROUP}:\n    models: [{', '.join(MODELS)}]\n    workflows:\n      self_refine:\n"
        f"        agents: [{', '.join(AGENTS)}]\n        router: {{table: self_refine.json}}\n"
    )
    config = StackConfig.on_free_ports(
        var,
        worker_models=MODELS,
        policy="aragog",
        model_groups=groups,
        profiler=False,
        cachemgr=False,
        worker_env={"CV_RUNNER": "emulated", "CV_MAX_NUM_SEQS": "2", "CV_TORCH_THREADS": "1"},
    )
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()


def model_of_worker(stack: Stack) -> dict[str, str]:
    """worker-<i> (counting from 1) serves the i-th of the stack's worker models."""
    return {f"worker-{i}": model for i, model in enumerate(stack.worker_models, start=1)}


async def records_of(stack: Stack, request_ids: set[str]) -> dict[str, common_pb2.CompletionRecord]:
    """The completion records of ``request_ids``, once all are on the stream (or 15 s pass)."""
    found = await records(stack, len(request_ids), timeout=15.0, request_ids=request_ids)
    return {record.request_id: record for record in found}


async def self_refine(client: AsyncOpenAI, workflow_id: str) -> list[tuple[str, str]]:
    """One workflow, stage after stage; (request id, answering model) per stage."""
    stages: list[tuple[str, str]] = []
    text = TASK
    for agent in AGENTS:
        meta = {
            "workflow_type_id": "self_refine",
            "workflow_id": workflow_id,
            "agent_id": agent,
            "parent_request_ids": [stages[-1][0]] if stages else [],
            "workflow_end": agent == AGENTS[-1],
        }
        reply = await client.chat.completions.create(
            model=GROUP,
            messages=[{"role": "user", "content": text}],
            max_tokens=MAX_TOKENS,
            extra_body={"app_metadata": meta, "ignore_eos": True},
        )
        assert reply.usage is not None and reply.usage.completion_tokens == MAX_TOKENS
        stages.append((reply.id.removeprefix("chatcmpl-"), reply.model))
        text = f"{TASK}\n{reply.choices[0].message.content}"
    return stages


def group_placements(stack: Stack) -> dict[str, float]:
    """cv_scheduler_group_placements_total of GROUP by model, from the scheduler's /metrics."""
    url = f"http://127.0.0.1:{stack.config.scheduler_metrics_port}/metrics"
    counts: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("cv_scheduler_group_placements_total{") and f'group="{GROUP}"' in line:
                model = line.split('model="', 1)[1].split('"', 1)[0]
                counts[model] = float(line.rsplit(" ", 1)[1])
    return counts


def test_models_lists_the_group(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    cards = {card.id: card for card in client.models.list().data}
    assert sorted(cards) == sorted([*MODELS, GROUP])
    assert cards[GROUP].owned_by == "clairvoyant-model-group"


def test_concurrent_workflows_run_their_stages_on_chosen_models(stack: Stack) -> None:
    async def run() -> list[list[tuple[str, str]]]:
        async with AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0) as client:
            return await asyncio.gather(*(self_refine(client, f"wf-{i}") for i in range(WORKFLOWS)))

    before = group_placements(stack)
    workflows = asyncio.run(run())
    stages = [stage for workflow in workflows for stage in workflow]
    assert {model for _, model in stages} <= set(MODELS)
    # Load spread the stages: some workflow ran on more than one model.
    assert any(len({model for _, model in workflow}) > 1 for workflow in workflows), workflows
    found = asyncio.run(records_of(stack, {request_id for request_id, _ in stages}))
    assert len(found) == len(stages)
    served_by = model_of_worker(stack)
    for request_id, model in stages:
        record = found[request_id]
        assert record.status == common_pb2.REQUEST_STATUS_OK
        assert served_by[record.worker_id] == record.model == model  # the answer names the model that ran it
    after = group_placements(stack)
    counted = {m: after.get(m, 0.0) - before.get(m, 0.0) for m in MODELS}
    assert counted == {m: float(sum(model == m for _, model in stages)) for m in MODELS}


def test_streaming_reports_the_chosen_model(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    meta = {"workflow_type_id": "self_refine", "workflow_id": "wf-stream", "agent_id": "generate"}
    chunks = list(
        client.chat.completions.create(
            model=GROUP,
            messages=[{"role": "user", "content": TASK}],
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"app_metadata": meta, "ignore_eos": True},
        )
    )
    models = {chunk.model for chunk in chunks}
    assert len(models) == 1 and models <= set(MODELS)
    request_id = chunks[0].id.removeprefix("chatcmpl-")
    record = asyncio.run(records_of(stack, {request_id}))[request_id]
    assert model_of_worker(stack)[record.worker_id] == models.pop()


def test_a_call_without_app_metadata_runs_on_the_reference_model(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model=GROUP, messages=[{"role": "user", "content": TASK}], max_tokens=4
    )
    assert reply.model == MODELS[-1]
    request_id = reply.id.removeprefix("chatcmpl-")
    record = asyncio.run(records_of(stack, {request_id}))[request_id]
    assert model_of_worker(stack)[record.worker_id] == MODELS[-1]


def test_an_unknown_model_is_404_naming_models_and_groups(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    with pytest.raises(NotFoundError) as refused:
        client.chat.completions.create(model="qwen2.5-72b", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.code == "model_not_found"
    assert refused.value.message.endswith(
        f"the model 'qwen2.5-72b' does not exist; available: {', '.join(sorted(MODELS))}; model groups: {GROUP}"
    )
