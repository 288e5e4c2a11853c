"""``reinvoked-agent``: TTFT of an agent re-invoked on its 4,000-token context, by where the context is.

One engine with L1, an L2 host pool and an L3 store serves an agent's first invocation (its context
plus a question); the context's blocks go to L3 as they are cached (write-through).  Then the
context is put where the case says, and the re-invocation (the context plus another question) is
timed from ``add_request`` to its first token:

    recompute   an engine with L1 alone, re-invoked on a context it has not seen (its first
                invocation ran on another of the same length, so it is as warm): a full prefill,
                and no write to L3 on the timed path
    L2          a filler prompt evicts it from L1 (demoted to L2), then DROP(target_tier=1) takes
                what is left of it in L1: it is promoted L2 -> L1 at admission
    L3          as L2, then DROP(target_tier=2) too: it is prefetched L3 -> L2 at arrival, then promoted

Two setups: the emulated H100 serving qwen2.5-14b, in virtual time (the engine's clock; transfers
charged from the cost model: PCIe for L2, the node's network for L3), and the torch runner with
SmolLM2-135M on this machine's CPU, in wall-clock time, with an in-memory L3 and, where the
``file://`` backend exists, a directory.  Medians over ``--repeats``.

    python -m clairvoyant.bench.reinvoked_agent --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clairvoyant.bench.common import (
    BENCHMARKS,
    RESULTS_DIR,
    BenchResult,
    median,
    progress,
    run_standalone,
)
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.l3 import L3Store, MemoryL3
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.tiers import Directive, InlineExecutor, TierConfig
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.base import ModelRunner
from clairvoyant.worker.runners.emulated import EmulatedRunner

GOAL_L2_RATIO = 25.0  # Pythia reports 25.5x for a context staged in host memory
TENANT = "bench"
CASES = ("recompute", "L2", "L3")
BLOCK = 16
# The first invocation answers with a few tokens: a request that finishes in the step of its prefill
# is not written through to L3 (its blocks are freed before the step's writes).
FIRST_ANSWER_TOKENS = 8


class VirtualClock:
    """The emulated runner's sleep moves it; the engine reads it."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Setup:
    """One engine's making: a fresh runner and engine over ``l3`` per case and repeat."""

    name: str
    context_tokens: int
    vocab: int  # token ids drawn below this
    build: Callable[[L3Store | None], tuple[LLMEngine, Callable[[], float]]]  # None: L1 alone
    l3: Callable[[], L3Store]
    close: Callable[[L3Store], None] = lambda store: store.close()


def engine_config(context_tokens: int, tiers: bool) -> EngineConfig:
    """L1 a little over one prompt (a filler of the same length evicts the context), L2 three."""
    blocks = -(-(context_tokens + 64) // BLOCK)
    host = TierConfig(num_host_blocks=3 * blocks, write_policy="write_through", prefetch_policy="wait_complete")
    return EngineConfig(
        block_size=BLOCK, num_blocks=blocks + 8, max_num_seqs=4, max_num_batched_tokens=8192,
        tiers=host if tiers else TierConfig(),
    )  # fmt: skip


def emulated_setup(model: str, gpu: str, context_tokens: int) -> Setup:
    def build(l3: L3Store | None) -> tuple[LLMEngine, Callable[[], float]]:
        clock = VirtualClock()
        runner = EmulatedRunner(model, gpu, 1, sleep=clock.sleep, distinct_tokens=True)
        config = engine_config(context_tokens, tiers=l3 is not None)
        engine = LLMEngine(runner, config, clock=clock, l3=l3, executor=InlineExecutor())
        return engine, clock

    return Setup(f"emulated {gpu} {model} (virtual time)", context_tokens, 256, build, MemoryL3)


def torch_setup(model: str, context_tokens: int, l3_kind: str, runner: ModelRunner) -> Setup:
    def build(l3: L3Store | None) -> tuple[LLMEngine, Callable[[], float]]:
        engine = LLMEngine(runner, engine_config(context_tokens, tiers=l3 is not None), clock=time.perf_counter,
                           l3=l3, executor=InlineExecutor())  # fmt: skip
        return engine, time.perf_counter

    if l3_kind == "memory":
        return Setup(f"torch CPU {model}, L3 memory (wall clock)", context_tokens, 8000, build, MemoryL3)
    folder = Path(tempfile.mkdtemp(prefix="cv-l3-"))

    def open_file_store() -> L3Store:
        from clairvoyant.worker.l3 import open_l3

        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return open_l3(f"file://{folder}")

    def close(store: L3Store) -> None:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)

    return Setup(f"torch CPU {model}, L3 file:// (wall clock)", context_tokens, 8000, build, open_file_store, close)


def ttft(
    engine: LLMEngine, clock: Callable[[], float], request_id: str, prompt: list[int], max_tokens: int = 1
) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens served from a cache) of ``prompt``, run alone to
    its end (``max_tokens``)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = clock()
    engine.add_request(EngineRequest(request_id, prompt, params, lineage=Lineage(TENANT, request_id.split("/")[0])))
    first: tuple[float, int] | None = None
    while engine.has_unfinished() or engine.has_pending_transfers():
        for out in engine.step():
            if out.request_id == request_id and out.new_token_ids and first is None:
                first = (clock() - start, out.cached_tokens)
        if first is not None and not engine.has_unfinished():
            break  # L3 writes still pending are applied by the next request's first step
    assert first is not None
    return first


def one_case(setup: Setup, case: str, repeat: int) -> tuple[float, int]:
    """Build a fresh engine, serve the first invocation, place the context as ``case`` says, and
    time the re-invocation."""
    rng = np.random.default_rng([repeat, 7])
    context, unseen, filler = (rng.integers(0, setup.vocab, setup.context_tokens).tolist() for _ in range(3))
    question, again = (rng.integers(0, setup.vocab, 32).tolist() for _ in range(2))
    workflow = f"agent{repeat}"
    if case == "recompute":
        engine, clock = setup.build(None)
        ttft(engine, clock, f"{workflow}/first", unseen + question, FIRST_ANSWER_TOKENS)
        return ttft(engine, clock, f"{workflow}/again", context + again)
    store = setup.l3()
    try:
        engine, clock = setup.build(store)
        ttft(engine, clock, f"{workflow}/first", context + question, FIRST_ANSWER_TOKENS)
        ttft(engine, clock, f"filler{repeat}/0", filler, FIRST_ANSWER_TOKENS)  # evicts the context: demoted to L2
        engine.apply_directive(Directive("drop", TENANT, workflow_id=workflow, target_tier=1))
        if case == "L3":
            engine.apply_directive(Directive("drop", TENANT, workflow_id=workflow, target_tier=2))
        return ttft(engine, clock, f"{workflow}/again", context + again)
    finally:
        setup.close(store)


def measure(setup: Setup, repeats: int) -> dict[str, tuple[float, int]]:
    """Per case, (median TTFT seconds, cached tokens of the median run's kind)."""
    out = {}
    for case in CASES:
        runs = [one_case(setup, case, i) for i in range(repeats)]
        out[case] = (median([seconds for seconds, _ in runs]), int(median([cached for _, cached in runs])))
        progress(f"{setup.name} {case}: TTFT {out[case][0] * 1e3:.2f} ms, {out[case][1]} tokens cached")
    return out


@BENCHMARKS.register("reinvoked-agent")
class ReinvokedAgent:
    help = "TTFT of a re-invoked agent's 4,000-token context: recomputed vs served from L2 vs from L3"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--context-tokens", type=int, default=4000)
        parser.add_argument("--repeats", type=int, default=5)
        parser.add_argument("--model", default="qwen2.5-14b", help="the emulated runner's model")
        parser.add_argument("--gpu", default="H100-80G")
        parser.add_argument("--torch-model", default="smollm2-135m-instruct", help="'' skips the CPU setup")
        parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")

    def run(self, args: argparse.Namespace) -> BenchResult:
        setups = [emulated_setup(args.model, args.gpu, args.context_tokens)]
        notes = [f"median of {args.repeats} repeats; each repeat is a fresh engine and a fresh context",
                 "recompute: an L1-only engine re-invoked on a context it has not seen; L2: evicted from L1 "
                 "by a filler prompt, then DROP(target_tier=1); L3: as L2, then DROP(target_tier=2)",
                 "TTFT: add_request to the first token; virtual seconds for the emulated runner "
                 "(PCIe and network time from the cost model), wall seconds for the torch runner"]  # fmt: skip
        if args.torch_model:
            from clairvoyant.worker.runners.loader import load_runner

            torch.set_num_threads(args.threads)
            progress(f"loading {args.torch_model}; torch threads = {torch.get_num_threads()}")
            runner = load_runner(args.torch_model, max_model_len=2 * args.context_tokens + 256)
            setups.append(torch_setup(args.torch_model, args.context_tokens, "memory", runner))
            try:
                import clairvoyant.worker.l3.file_store  # noqa: F401  (the file:// backend, when present)

                setups.append(torch_setup(args.torch_model, args.context_tokens, "file", runner))
            except ImportError:
                notes.append("no file:// L3 backend in this tree (clairvoyant.worker.l3.file_store): skipped")
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        for setup in setups:
            results = measure(setup, args.repeats)
            base = results["recompute"][0]
            for case, (seconds, cached) in results.items():
                rows.append([setup.name, case, cached, seconds * 1e3, base / seconds])
            summary[f"{setup.name}: recompute / L2"] = base / results["L2"][0]
            summary[f"{setup.name}: recompute / L3"] = base / results["L3"][0]
        summary["goal_l2_ratio"] = GOAL_L2_RATIO
        params = {k: v for k, v in vars(args).items() if k not in ("command", "out_dir")}
        return BenchResult("reinvoked-agent", ["setup", "context served from", "cached tokens", "TTFT ms",
                                               "recompute / this"], rows, summary, notes, params)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return run_standalone(ReinvokedAgent(), argv, prog="python -m clairvoyant.bench.reinvoked_agent",
                          description=__doc__, out_dir=RESULTS_DIR / "reinvoked-agent")  # fmt: skip

if __name__ == "__main__":
    sys.exit(main())
