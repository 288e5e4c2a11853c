"""The profiler in a running stack: it learns a workflow from the traffic the OpenAI SDK sends through
the gateway, and the next request of that workflow comes back annotated with what it learned."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from clairvoyant.core.stack import Stack, StackConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHAIN = (("planner", 4), ("coder", 12), ("reviewer", 6))  # agent, output tokens (EOS ignored)
WORKFLOWS = 40


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack-profiler")
    config = StackConfig.on_free_ports(
        var,
        model="tiny-random",
        workers=1,
        # A profile leaves shadow after 5 closed instances (30 by default) once its distributions
        # have converged; a generous Annotate deadline, as a CI machine's cores are shared.
        env={"CV_MIN_INSTANCES": "5", "CV_PROFILER_TIMEOUT_S": "2.0"},
        worker_env={"CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "256"},
    )
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()


def call(
    client: OpenAI, workflow_id: str, agent: str, max_tokens: int, last: bool = False, workflow_type: str = "triage"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"workflow_type_id": workflow_type, "workflow_id": workflow_id, "agent_id": agent}
    if last:
        meta["workflow_end"] = True
    reply = client.chat.completions.create(
        model="tiny-random",
        messages=[{"role": "user", "content": f"{agent} step of {workflow_id}"}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"app_metadata": meta, "ignore_eos": True, "echo_annotations": True},
    )
    assert reply.usage is not None and reply.usage.completion_tokens == max_tokens
    return dict((reply.model_extra or {}).get("annotations") or {})


def test_the_profiler_learns_a_chain_and_annotates_its_next_requests(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    # The first Annotate of a fresh stack pays for connecting and warming the profiler; on a busy
    # machine it can miss its deadline and come back bare. Warm the path on another workflow type,
    # so the chain below measures learning, not start-up.
    deadline = time.monotonic() + 60
    warm: dict[str, Any] = {}
    while not warm and time.monotonic() < deadline:
        warm = call(client, f"warm-{time.monotonic_ns()}", "warmup", 1, workflow_type="warmup")
    assert warm.get("confidence") == "CONFIDENCE_NONE", warm

    first = call(client, "wf-0", "planner", 4)
    assert first.get("confidence") == "CONFIDENCE_NONE"  # never seen: nothing predicted

    for i in range(WORKFLOWS):
        for position, (agent, tokens) in enumerate(CHAIN):
            if (i, position) != (0, 0):
                call(client, f"wf-{i}", agent, tokens, last=position == len(CHAIN) - 1)

    # The records reach the profiler through JetStream; wait until it has learned from them.
    deadline = time.monotonic() + 60
    probe = 0
    while True:
        probe += 1
        annotations = call(client, f"probe-{probe}", "planner", 4)
        if annotations.get("confidence") in ("CONFIDENCE_LOW", "CONFIDENCE_HIGH") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert annotations["confidence"] in ("CONFIDENCE_LOW", "CONFIDENCE_HIGH"), annotations
    # Every planner produced exactly 4 tokens; the planner is always followed by the coder, then
    # the reviewer, and the workflow ends there.
    assert annotations["predicted_output_len"]["p50"] == 4.0
    assert annotations["predicted_output_len"]["p99"] >= 4.0
    assert [n["agent_id"] for n in annotations["next_agents"]] == ["coder"]
    assert annotations["next_agents"][0]["probability"] == pytest.approx(1.0)
    assert annotations["expected_remaining_steps"] == pytest.approx(2.0)
    assert "coder" in annotations["predicted_path_regex"] and "reviewer" in annotations["predicted_path_regex"]

    # The same workflow one step later: the coder's own length, and one step left.
    coder = call(client, f"probe-{probe}", "coder", 12)
    assert coder["predicted_output_len"]["p50"] == 12.0
    assert [n["agent_id"] for n in coder["next_agents"]] == ["reviewer"]
    assert coder["expected_remaining_steps"] == pytest.approx(1.0)
