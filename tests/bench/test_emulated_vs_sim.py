"""An emulated worker and the simulator agree on a small case, to the step.

The live side is the worker's own engine adapter (``engine_loop.AsyncEngine``: its engine thread,
its command queue, its asyncio delivery) around an ``EmulatedRunner`` whose injected ``sleep``
advances a virtual clock instead of waiting.  The simulator runs the same requests, at the same
arrival times, on one replica of the same shape.  Every request must finish at the same instant
(and see the same prefix-cache hits) in both.

Lock-step protocol (the only thing the test adds to the adapter)::

    engine thread                       driver (asyncio)
    step: forward -> sleep(d) ───────>  step [now, now + d): arrivals in (now, now + d] are
                 (blocks)                submitted (they join the next step, as in the simulator)
                 <─────── resume ─────  now = now + d
    outputs delivered ───────────────>  consumers stamp finished requests with ``now``
    idle (no unfinished requests)       driver jumps ``now`` to the next arrival and submits it
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import Call, NewSegment, SystemSegment, WorkflowProgram

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MODEL, GPU, SEED = "llama-3.1-8b", "H100-80G", 0
# A small token budget so long prompts are prefilled in chunks, mixed with other requests' decodes.
CONFIG = EngineConfig(block_size=16, num_blocks=4096, max_num_seqs=16, max_num_batched_tokens=512)


def _programs(count: int) -> list[tuple[float, WorkflowProgram]]:
    """Single-call workflows sharing one system prompt (so the prefix cache hits), with distinct
    Poisson arrival times, prompts of 300-1,300 tokens and outputs of 1-60 tokens."""
    rng = np.random.default_rng(4)
    times = np.cumsum(rng.exponential(0.04, size=count))
    out = []
    for i, at in enumerate(times):
        system, fresh, output = 256, int(rng.integers(50, 1000)), int(rng.integers(1, 60))
        call = Call(
            call_id=f"wf-{i}/0", index=0, agent_id="solver", model=MODEL,
            prompt=(SystemSegment("system", "solver", system), NewSegment("new", fresh)),
            prompt_tokens=system + fresh, output_tokens=output, dependencies=(),
        )  # fmt: skip
        out.append((float(at), WorkflowProgram("probe", f"wf-{i}", (call,))))
    return out


def _simulate(arrivals: list[tuple[float, WorkflowProgram]]) -> tuple[RunRecords, int]:
    def no_sleep(seconds: float) -> None:
        del seconds

    runner = EmulatedRunner(MODEL, GPU, sleep=no_sleep, distinct_tokens=True)
    records = Simulator([ReplicaSpec("w0", runner, CONFIG)], "fcfs-rr", seed=SEED).run(arrivals)
    return records, runner.steps


class VirtualTime:
    """The emulated runner's ``sleep``: report the step to the driver, block until it resumes us."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = 0.0
        self.loop = loop
        self.steps: asyncio.Queue[float] = asyncio.Queue()
        self._resume = threading.Semaphore(0)

    def sleep(self, seconds: float) -> None:  # on the engine thread
        self.loop.call_soon_threadsafe(self.steps.put_nowait, seconds)
        self._resume.acquire()

    def resume(self) -> None:
        self._resume.release()


async def _emulate(arrivals: list[tuple[float, WorkflowProgram]]) -> tuple[dict[str, tuple[float, float, int]], int]:
    """{call id: (first token, end, cached tokens)} from the live adapter, and the runner's steps."""
    clock = VirtualTime(asyncio.get_running_loop())
    runner = EmulatedRunner(MODEL, GPU, sleep=clock.sleep, distinct_tokens=True)
    engine = AsyncEngine(LLMEngine(runner, CONFIG, clock=lambda: clock.now))
    prompts = PromptBook(SEED)
    results: dict[str, tuple[float, float, int]] = {}
    idle = asyncio.Event()
    outstanding = 0

    async def consume(request: EngineRequest) -> None:
        nonlocal outstanding
        first = None
        async for out in engine.generate(request):
            if out.new_token_ids and first is None:
                first = clock.now
            if out.finished:
                assert first is not None
                results[request.request_id] = (first, clock.now, out.cached_tokens)
        outstanding -= 1
        if outstanding == 0:
            idle.set()

    async def submit(at: float, program: WorkflowProgram) -> None:
        nonlocal outstanding
        call = program.calls[0]
        request = EngineRequest(
            request_id=call.call_id,
            prompt_token_ids=prompts.prompt(program.workflow_type, call),
            sampling=SamplingParams(max_tokens=call.output_tokens, temperature=0.0, ignore_eos=True),
            lineage=Lineage("default", program.workflow_id, call.agent_id, call.call_id),
            arrival_time=at,
        )
        outstanding += 1
        idle.clear()
        asyncio.get_running_loop().create_task(consume(request))
        await asyncio.sleep(0)  # the task runs up to its first wait: the add command is queued

    engine.start()
    try:
        pending = list(arrivals)
        while pending or outstanding:
            if not outstanding:  # the engine is idle: jump to the next arrival
                clock.now = pending[0][0]
                await submit(*pending.pop(0))
            step = asyncio.ensure_future(clock.steps.get())
            done_all = asyncio.ensure_future(idle.wait())
            finished, _ = await asyncio.wait({step, done_all}, return_when=asyncio.FIRST_COMPLETED)
            if step not in finished:
                step.cancel()
                continue
            done_all.cancel()
            end = clock.now + step.result()
            while pending and pending[0][0] <= end:  # arrive during the step: join the next one
                await submit(*pending.pop(0))
            clock.now = end
            clock.resume()
    finally:
        engine.stop()
    return results, runner.steps


def test_emulated_worker_and_simulator_finish_every_request_at_the_same_instant() -> None:
    arrivals = _programs(24)
    sim, sim_steps = _simulate(arrivals)
    live, live_steps = asyncio.run(_emulate(arrivals))

    assert len(sim.calls) == len(live) == 24
    assert live_steps == sim_steps
    overlapping = 0
    for call in sim.calls:
        first, end, cached = live[call.call_id]
        assert first == pytest.approx(call.first_token_time, abs=1e-9), call.call_id
        assert end == pytest.approx(call.end_time, abs=1e-9), call.call_id
        assert cached == call.cached_tokens
        overlapping += any(
            other.ready_time < call.ready_time < other.end_time for other in sim.calls if other is not call
        )
    # The case is not trivial: most requests share steps with others, and the system prompt is
    # served from the prefix cache after the first request.
    assert overlapping >= 12
    assert sum(c.cached_tokens for c in sim.calls) >= 23 * 256
