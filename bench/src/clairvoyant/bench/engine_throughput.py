"""``engine-throughput``: output tokens/s of LLMEngine at batch 1, 8 and 32 vs HF ``generate`` one at a time.

Every batch gets a fresh engine, a warm-up round of the same shape, then the timed region: all ``B``
requests (distinct prompts of ``--prompt-len`` tokens, greedy, ``--output-len`` tokens with
ignore_eos) submitted at once and the engine stepped until all finish.  The baseline runs the same
weights through ``transformers`` one request at a time, which is what a naive server does; its
tokens/s does not depend on ``B``, so one measurement serves every row's ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from dataclasses import dataclass

import torch
from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.models import MODELS, SMOLLM2, hf_generate, load_hf, load_ours, text_prompts
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.runners.torch_runner import TorchRunner

GOAL_RATIO = 5.0
GOAL_BATCH = 32


@dataclass(frozen=True)
class EngineRun:
    tokens: int  # output tokens produced in the timed region
    seconds: float  # submit-all to last-finished
    steps: int
    first_step_s: float  # the step that prefills every prompt (and samples each first token)
    first_tokens: list[int]  # request 0's output, to compare with the baseline's


def engine_for(runner: TorchRunner, batch: int, prompt_len: int, output_len: int) -> LLMEngine:
    per_request = -(-(prompt_len + output_len) // 16)
    config = EngineConfig(
        block_size=16,
        num_blocks=2 * batch * per_request + 16,  # room for the warm-up's cached blocks as well
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch * prompt_len),  # every prefill fits the first step
    )
    return LLMEngine(runner, config)


def run_batch(engine: LLMEngine, prompts: list[list[int]], output_len: int, tag: str) -> EngineRun:
    sampling = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"{tag}-{i}", prompt, sampling))
    tokens, steps, first_step_s = 0, 0, 0.0
    first: list[int] = []
    while engine.has_unfinished():
        outputs = engine.step()
        steps += 1
        if steps == 1:
            first_step_s = time.perf_counter() - start
        for out in outputs:
            tokens += len(out.new_token_ids)
            if out.request_id == f"{tag}-0":
                first.extend(out.new_token_ids)
    return EngineRun(tokens, time.perf_counter() - start, steps, first_step_s, first)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@BENCHMARKS.register("engine-throughput")
class EngineThroughput:
    help = "output tokens/s of LLMEngine at batch 1/8/32 vs HF transformers generate, one at a time"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
        parser.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
        parser.add_argument("--prompt-len", type=int, default=64)
        parser.add_argument("--output-len", type=int, default=64)
        parser.add_argument("--hf-requests", type=int, default=4, help="baseline requests timed (sequential)")
        parser.add_argument("--repeats", type=int, default=3, help="timed runs per batch (median reported)")
        parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
        parser.add_argument("--quick", action="store_true", help="16 output tokens, 1 run, 2 baseline requests")
        parser.add_argument("--profile", action="store_true", help="cProfile one extra run at the largest batch")

    def run(self, args: argparse.Namespace) -> BenchResult:
        torch.set_num_threads(args.threads)
        if args.quick:
            args.output_len, args.hf_requests, args.repeats = min(args.output_len, 16), min(args.hf_requests, 2), 1
        batches = [int(b) for b in args.batches.split(",")]
        progress(f"loading {args.model} (ours); torch threads = {torch.get_num_threads()}")
        runner = load_ours(args.model)
        prompts = text_prompts(runner.tokenizer, max(batches), args.prompt_len, seed=1)
        warm = text_prompts(runner.tokenizer, max(batches), args.prompt_len, seed=2, tag="warm-up ")

        ours: dict[int, EngineRun] = {}
        spread: dict[int, tuple[float, float]] = {}
        first_tokens: dict[int, list[int]] = {}  # request 0 of the first run: the same prompt in every batch
        for batch in batches:
            engine = engine_for(runner, batch, args.prompt_len, args.output_len)
            run_batch(engine, warm[:batch], min(8, args.output_len), f"warm{batch}")
            runs: list[EngineRun] = []
            for r in range(args.repeats):
                # Fresh prompts every repeat: the previous repeat's are in the prefix cache now.
                batch_prompts = prompts[:batch] if r == 0 else text_prompts(
                    runner.tokenizer, batch, args.prompt_len, seed=100 + r, tag=f"repeat {r} ")
                runs.append(run_batch(engine, batch_prompts, args.output_len, f"b{batch}r{r}"))
                progress(f"ours: batch {batch}, run {r + 1}/{args.repeats}: "
                         f"{runs[-1].tokens / runs[-1].seconds:.1f} tok/s ({runs[-1].steps} steps)")
            first_tokens[batch] = runs[0].first_tokens
            rates = sorted(run.tokens / run.seconds for run in runs)
            spread[batch] = (rates[0], rates[-1])
            ours[batch] = sorted(runs, key=lambda run: run.seconds)[len(runs) // 2]  # the median run
        if args.profile:
            self._profile(runner, prompts, max(batches), args)

        hf_tps, hf_seconds = float("nan"), float("nan")
        notes: list[str] = []
        hf_model = load_hf(args.model)
        if hf_model is None:
            notes.append(f"{args.model} has no HF transformers twin: no baseline, no ratios")
        else:
            progress("HF transformers: warm-up ...")
            hf_generate(hf_model, warm[0], min(8, args.output_len))
            hf_outputs: list[list[int]] = []
            start = time.perf_counter()
            for i, prompt in enumerate(prompts[: args.hf_requests]):
                hf_outputs.append(hf_generate(hf_model, prompt, args.output_len))
                progress(f"HF transformers: request {i + 1}/{args.hf_requests} done")
            hf_seconds = time.perf_counter() - start
            hf_tps = sum(len(o) for o in hf_outputs) / hf_seconds
            agree = ", ".join(f"{common_prefix(first_tokens[b], hf_outputs[0])} at batch {b}" for b in batches)
            notes.append(f"greedy output of request 0, leading tokens equal to HF's (of {args.output_len}): {agree}")

        rows: list[list[object]] = []
        if hf_model is not None:
            hf_tokens = args.hf_requests * args.output_len
            rows.append(["HF generate, 1 at a time", 1, hf_tokens, hf_seconds, hf_tps, "-",
                         hf_seconds * 1e3 / hf_tokens, 1.0])
        for batch, run in ours.items():
            decode_ms = (run.seconds - run.first_step_s) * 1e3 / max(1, run.steps - 1)
            low, high = spread[batch]
            rows.append([f"LLMEngine, batch {batch}", batch, run.tokens, run.seconds, run.tokens / run.seconds,
                         f"{low:.1f}-{high:.1f}", decode_ms, (run.tokens / run.seconds) / hf_tps])
        summary: dict[str, object] = {"baseline_tokens_per_s": hf_tps}
        if GOAL_BATCH in ours:
            ratio = (ours[GOAL_BATCH].tokens / ours[GOAL_BATCH].seconds) / hf_tps
            summary.update({f"ratio_at_batch_{GOAL_BATCH}": ratio, "goal_ratio": GOAL_RATIO,
                            "goal_met": bool(ratio >= GOAL_RATIO) if ratio == ratio else None})
        return BenchResult(
            name="engine-throughput",
            columns=["system", "batch", "out tokens", "seconds", "tok/s", "tok/s range", "ms/step", "vs HF"],
            rows=rows,
            summary=summary,
            notes=notes + ["ms/step: decode steps for LLMEngine (after the prefill step), per token for HF"],
            params={k: v for k, v in vars(args).items() if k not in ("command", "out_dir")},
        )

    @staticmethod
    def _profile(runner: TorchRunner, prompts: list[list[int]], batch: int, args: argparse.Namespace) -> None:
        engine = engine_for(runner, batch, args.prompt_len, args.output_len)
        profiler = cProfile.Profile()
        profiler.enable()
        run_batch(engine, prompts[:batch], args.output_len, "profile")
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue())
