"""The profiler in a running stack: it learns a workflow from the traffic the OpenAI SDK sends through
the gateway, and the next request of that workflow comes back annotated with what it learned.

A profile leaves shadow only once its agents' output lengths and next-step paths have converged
(service times depend on load and no longer gate it).  The worker is emulated, so a call's output
length is what the request asks for however busy this machine is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from openai import OpenAI

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.stack import Stack, StackConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODEL = "qwen2.5-32b"  # emulated on an A100: ~36 ms a token, ~0.8 s a workflow
CHAIN = (("planner", 4), ("coder", 12), ("reviewer", 6))  # agent, output tokens (EOS ignored)
WORKFLOWS = 20
MAX_WORKFLOWS = 128  # convergence is checked at 16, 32, 64 and 128 samples per agent
LEARNED = ("CONFIDENCE_LOW", "CONFIDENCE_HIGH")
T = TypeVar("T")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack-profiler")
    config = StackConfig.on_free_ports(
        var,
        model=MODEL,
        workers=1,
        # A profile leaves shadow after 5 closed instances (30 by default) once its distributions
        # have converged.  The Annotate deadline only bounds a hung call here: a bare reply would
        # hide what the profiler learned, and a loaded machine can hold the profiler off for seconds.
        env={"CV_MIN_INSTANCES": "5", "CV_PROFILER_TIMEOUT_S": "10.0"},
        worker_env={"CV_RUNNER": "emulated", "CV_GPU": "A100-80G"},
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
        model=MODEL,
        messages=[{"role": "user", "content": f"{agent} step of {workflow_id}"}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"app_metadata": meta, "ignore_eos": True, "echo_annotations": True},
    )
    assert reply.usage is not None and reply.usage.completion_tokens == max_tokens
    return dict((reply.model_extra or {}).get("annotations") or {})


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll ``probe`` until it returns something other than None; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (found := probe()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return found


def profile_with(stack: Stack, instances: int, workflow_type: str = "triage") -> profiler_pb2.WorkflowProfile | None:
    """The profiler's profile of ``workflow_type`` once it has closed ``instances`` workflows, else None."""
    with grpc.insecure_channel(stack.profiler_address) as channel:
        stub = profiler_pb2_grpc.ProfilerStub(channel)
        try:
            found = stub.GetProfile(
                profiler_pb2.GetProfileRequest(tenant="default", workflow_type_id=workflow_type), timeout=10)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise
    return found if found.instances >= instances else None


def test_the_profiler_learns_a_chain_and_annotates_its_next_requests(stack: Stack) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0)
    # The first Annotate of a fresh stack pays for connecting and warming the profiler; on a busy
    # machine it can miss its deadline and come back bare. Warm the path on another workflow type,
    # so the chain below measures learning, not start-up.
    warm = wait_for("an annotated reply",
                    lambda: call(client, f"warm-{time.monotonic_ns()}", "warmup", 1, workflow_type="warmup") or None)
    # NONE, or SHADOW once a retried warm-up's earlier records were ingested: never learned.
    assert warm.get("confidence") in ("CONFIDENCE_NONE", "CONFIDENCE_SHADOW"), warm

    first = call(client, "wf-0", "planner", 4)
    assert first.get("confidence") == "CONFIDENCE_NONE"  # never seen: nothing predicted

    # A profile leaves shadow once every agent's output lengths and next-step path have converged
    # (checked each time the closed workflows double).  The chain fixes both, so the first
    # checkpoint normally does; should it not, the chain runs on up to the next checkpoint, each
    # time after the profiler has ingested every closed workflow.
    done, target = 0, WORKFLOWS
    while True:
        for i in range(done, target):
            for position, (agent, tokens) in enumerate(CHAIN):
                if (i, position) != (0, 0):
                    call(client, f"wf-{i}", agent, tokens, last=position == len(CHAIN) - 1)
        done = target
        # The records reach the profiler through JetStream after each reply: wait until it has them all.
        learned = wait_for(f"the profiler to ingest {done} workflows", partial(profile_with, stack, done))
        assert learned.instances == done
        if common_pb2.Confidence.Name(learned.confidence) in LEARNED:
            break
        assert target < MAX_WORKFLOWS, f"still in shadow after {done} workflows: {learned}"
        target = 1 << target.bit_length()  # the next power of two

    annotations = call(client, "probe-1", "planner", 4)
    assert annotations["confidence"] in LEARNED, annotations
    # Every planner produced exactly 4 tokens; the planner is always followed by the coder, then
    # the reviewer, and the workflow ends there.
    assert annotations["predicted_output_len"]["p50"] == 4.0
    assert annotations["predicted_output_len"]["p99"] >= 4.0
    assert [n["agent_id"] for n in annotations["next_agents"]] == ["coder"]
    assert annotations["next_agents"][0]["probability"] == pytest.approx(1.0)
    assert annotations["expected_remaining_steps"] == pytest.approx(2.0)
    assert "coder" in annotations["predicted_path_regex"] and "reviewer" in annotations["predicted_path_regex"]

    # The same workflow one step later: the coder's own length, and one step left.  (The coder's
    # position is found from its agent alone when the planner's record is not ingested yet.)
    coder = call(client, "probe-1", "coder", 12)
    assert coder["predicted_output_len"]["p50"] == 12.0
    assert [n["agent_id"] for n in coder["next_agents"]] == ["reviewer"]
    assert coder["expected_remaining_steps"] == pytest.approx(1.0)
