"""The autoscaler in a running stack: Pythia's phase-adaptive scaling with the local actuator.

A planner model is served by one static emulated worker; the explorer model has no worker until
the autoscaler (policy ``pythia``, local actuator, 3 GPUs) starts one.  The profiler first learns
the workflow ``planner -> <explorer>{10}`` from traffic sent with the official OpenAI SDK.  Then a
cron burst of planners arrives at once: while the planners still run, their annotations project
ten explorer calls each, so the autoscaler starts explorer workers *before* the fan-out's calls
are sent (asserted from the ``cv.scaling.*`` events' timestamps).  After the phase, the explorer
workers are drained and released.  Every request completes, and none is placed on a replica after
it was drained (asserted from the completion records on JetStream).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import nats
import pytest
from nats.js.api import DeliverPolicy
from openai import OpenAI

from clairvoyant.contracts.v1 import autoscaler_pb2, common_pb2, profiler_pb2, profiler_pb2_grpc
from clairvoyant.core.bus import COMPLETIONS_SUBJECT
from clairvoyant.stack import Stack, StackConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

PLANNER_MODEL = "qwen2.5-32b"  # the static worker, emulated on an A100: ~36 ms a token
EXPLORER_MODEL = "llama-3.1-8b"  # the autoscaled model
WORKFLOW = "fanout_research"
FAN_OUT = 10
LEARNED = ("CONFIDENCE_LOW", "CONFIDENCE_HIGH")


class Events:
    """``cv.scaling.*`` events as (wall time, kind, replica id, model), collected on a thread."""

    def __init__(self, url: str) -> None:
        self.items: list[tuple[float, str, str, str]] = []
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(url)), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "could not subscribe to cv.scaling.*"

    async def _run(self, url: str) -> None:
        nc = await nats.connect(url)
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        async def on_event(msg: nats.aio.msg.Msg) -> None:
            event = autoscaler_pb2.ScalingEvent.FromString(msg.data)
            self.items.append((event.time, event.kind, event.replica_id, event.model))

        await nc.subscribe("cv.scaling.*", cb=on_event)
        self._ready.set()
        await self._stop.wait()
        await nc.close()

    def of(self, kind: str, model: str = EXPLORER_MODEL) -> list[tuple[float, str]]:
        return [(t, rid) for t, k, rid, m in list(self.items) if k == kind and m == model]

    def close(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    var: Path = tmp_path_factory.mktemp("stack-autoscaler")
    config = StackConfig.on_free_ports(
        var,
        model=PLANNER_MODEL,
        workers=1,
        env={"CV_MIN_INSTANCES": "5", "CV_PROFILER_TIMEOUT_S": "10.0"},
        worker_env={"CV_RUNNER": "emulated", "CV_GPU": "A100-80G", "CV_TORCH_THREADS": "1"},
        autoscaler="pythia",
        autoscaler_env={
            "CV_MODELS": EXPLORER_MODEL,
            "CV_GPU_BUDGET": "3",  # the planner's worker and two explorers
            "CV_INTERVAL_S": "0.5",
            "CV_PROFILES": json.dumps({EXPLORER_MODEL: {"calls_per_replica": 4, "startup_s": 5}}),
            "CV_STARTUP_ALLOWANCE_S": "120",
            "CV_LOG_LEVEL": "INFO",
        },
        log_dir=var / "logs",
    )
    stack = Stack(config).start(ready_timeout=120)
    try:
        yield stack
    finally:
        stack.stop()


def call(client: OpenAI, workflow_id: str, agent: str, model: str, max_tokens: int, last: bool = False) -> str:
    meta: dict[str, object] = {"workflow_type_id": WORKFLOW, "workflow_id": workflow_id, "agent_id": agent}
    if last:
        meta["workflow_end"] = True
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"{agent} of {workflow_id}"}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"app_metadata": meta, "ignore_eos": True},
    )
    assert reply.usage is not None and reply.usage.completion_tokens == max_tokens
    return reply.id.removeprefix("chatcmpl-")  # the request id its completion record carries


def workflow(client: OpenAI, pool: ThreadPoolExecutor, workflow_id: str, planner_tokens: int,
             sent: list[float] | None = None) -> list[str]:  # fmt: skip
    """planner -> ten explorers in parallel; returns the request ids."""
    ids = [call(client, workflow_id, "planner", PLANNER_MODEL, planner_tokens)]
    if sent is not None:
        sent.append(time.time())  # the fan-out's calls are sent now
    futures = [
        pool.submit(call, client, workflow_id, "explorer", EXPLORER_MODEL, 4, last=i == FAN_OUT - 1)
        for i in range(FAN_OUT)
    ]
    return ids + [f.result() for f in futures]


def learned_confidence(stack: Stack) -> str:
    with grpc.insecure_channel(stack.profiler_address) as channel:
        stub = profiler_pb2_grpc.ProfilerStub(channel)
        try:
            profile = stub.GetProfile(
                profiler_pb2.GetProfileRequest(tenant="default", workflow_type_id=WORKFLOW), timeout=10
            )
        except grpc.RpcError:
            return ""
    return common_pb2.Confidence.Name(profile.confidence)


def wait_until(what: str, probe: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not probe():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


async def placements(url: str, request_ids: set[str]) -> dict[str, tuple[str, float]]:
    """request id -> (worker id, wall time the scheduler placed it), from the completion records."""
    found: dict[str, tuple[str, float]] = {}
    nc = await nats.connect(url)
    try:
        sub = await nc.jetstream().subscribe(
            COMPLETIONS_SUBJECT, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        deadline = time.monotonic() + 60
        while set(found) < request_ids and time.monotonic() < deadline:
            try:
                msg = await sub.next_msg(timeout=2)
            except nats.errors.TimeoutError:
                continue
            record = common_pb2.CompletionRecord.FromString(msg.data)
            if record.request_id in request_ids:
                found[record.request_id] = (record.worker_id, record.timing.scheduled_time)
    finally:
        await nc.close()
    return found


def test_pythia_starts_explorers_before_the_fan_out_and_releases_them_after(stack: Stack) -> None:
    events = Events(stack.nats_url)
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=300)
    all_ids: list[str] = []
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            # Learn the workflow.  The first fan-out waits in the queue while a replica starts (the
            # explorer model has none); once the profile converges the phase ends.
            done = 0
            while learned_confidence(stack) not in LEARNED:
                assert done < 64, f"the profile did not converge after {done} workflows"
                batch = [pool.submit(workflow, client, pool, f"train-{done + i}", 4) for i in range(4)]
                all_ids += [rid for f in batch for rid in f.result()]
                done += 4
                time.sleep(0.5)
            assert events.of("started"), "the training fan-outs started no explorer replica"

            # The phase is over: the explorers drain and are released, with no keep-alive.
            wait_until("the explorer replicas to be released",
                       lambda: len(events.of("released")) >= len(events.of("started")), timeout=90)  # fmt: skip
            burst_start = time.time()
            assert not stack_explorers_serving(events)

            # A cron burst: six planners at once, each about 5 s long (150 tokens at ~36 ms).
            sent: list[float] = []
            burst = [pool.submit(workflow, client, pool, f"cron-{i}", 150, sent) for i in range(6)]
            all_ids += [rid for f in burst for rid in f.result()]
        started = [t for t, _ in events.of("started") if t >= burst_start]
        assert started, "the burst started no explorer replica"
        assert min(started) < min(sent), (
            f"an explorer replica started {min(started) - burst_start:.1f} s into the burst, after the "
            f"fan-out's first calls at {min(sent) - burst_start:.1f} s"
        )
        # After the phase, every replica it started is drained and released.
        wait_until("the burst's explorers to be released",
                   lambda: len(events.of("released")) >= len(events.of("started")), timeout=150)  # fmt: skip
    finally:
        events.close()

    records = asyncio.run(placements(stack.nats_url, set(all_ids)))
    assert set(records) == set(all_ids), "some request left no completion record"
    drained_at = {rid: t for t, rid in events.of("drain")}
    late = [
        (request_id, worker_id)
        for request_id, (worker_id, placed_at) in records.items()
        if worker_id in drained_at and placed_at > drained_at[worker_id] + 0.05
    ]
    assert not late, f"requests placed on a replica after it was drained: {late[:5]}"


def stack_explorers_serving(events: Events) -> bool:
    """Whether an explorer replica started and not yet released is left."""
    return len(events.of("started")) > len(events.of("released"))
