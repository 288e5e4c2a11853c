"""``engine-throughput``: output tokens/s of LLMEngine at batch 1, 8 and 32 vs HF ``generate`` one at a time.

A timed run of batch ``B``: ``B`` requests (distinct prompts of ``--prompt-len`` tokens, greedy,
``--output-len`` tokens with ignore_eos) submitted at once and the engine stepped until all finish.
The baseline runs the same weights through ``transformers`` one request at a time, which is what a
naive server does; its tokens/s does not depend on ``B``, so it is the denominator of every ratio.

After a warm-up of every shape, ``--repeats`` rounds run; each round runs one baseline request and
then every batch size, so slow phases of a shared machine hit both sides of the ratio alike::

    round 1: HF(1 request)  ours(B=1)  ours(B=8)  ours(B=32)
    round 2: HF(1 request)  ours(B=1)  ours(B=8)  ours(B=32)   ...
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
    """An engine that runs ``batch`` requests at once; fewer submitted = a smaller batch."""
    per_request = -(-(prompt_len + output_len) // 16)
    config = EngineConfig(
        block_size=16,
        # Twice the working set: finished prompts stay in the prefix cache until LRU-evicted.
        num_blocks=2 * batch * per_request + 16,
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
        parser.add_argument("--repeats", type=int, default=3, help="rounds (one baseline request + every batch)")
        parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
        parser.add_argument("--quick", action="store_true", help="16 output tokens, 1 round")
        parser.add_argument("--profile", action="store_true", help="cProfile one extra run at the largest batch")

    def run(self, args: argparse.Namespace) -> BenchResult:
        torch.set_num_threads(args.threads)
        if args.quick:
            args.output_len, args.repeats = min(args.output_len, 16), 1
        batches = [int(b) for b in args.batches.split(",")]
        progress(f"loading {args.model}; torch threads = {torch.get_num_threads()}")
        runner = load_ours(args.model)
        hf_model = load_hf(args.model)
        engine = engine_for(runner, max(batches), args.prompt_len, args.output_len)

        def prompts(count: int, seed: int, tag: str) -> list[list[int]]:
            return text_prompts(runner.tokenizer, count, args.prompt_len, seed, tag)

        progress("warm-up ...")
        # Full length: a shorter warm-up left the first timed batch-32 run ~20% slow (new shapes, allocator).
        for batch in batches:
            run_batch(engine, prompts(batch, 1, f"warm-up {batch} "), args.output_len, f"warm{batch}")
        if hf_model is not None:
            hf_generate(hf_model, prompts(1, 1, "warm-up hf ")[0], min(8, args.output_len))

        ours: dict[int, list[EngineRun]] = {batch: [] for batch in batches}
        hf_tokens, hf_seconds = 0, 0.0
        agree: list[str] = []
        for r in range(args.repeats):
            # Fresh prompts for every run: earlier ones sit in the prefix cache.
            round_prompts = {b: prompts(b, 100 * r + b, f"round {r} batch {b} ") for b in batches}
            if hf_model is not None:
                start = time.perf_counter()
                hf_out = hf_generate(hf_model, round_prompts[batches[0]][0], args.output_len)
                hf_seconds += time.perf_counter() - start
                hf_tokens += len(hf_out)
                progress(f"round {r + 1}: HF generate: {hf_tokens / hf_seconds:.1f} tok/s so far")
            for batch in batches:
                run = run_batch(engine, round_prompts[batch], args.output_len, f"r{r}b{batch}")
                ours[batch].append(run)
                progress(f"round {r + 1}: batch {batch}: {run.tokens / run.seconds:.1f} tok/s ({run.steps} steps)")
            if hf_model is not None:
                agree.append(str(common_prefix(ours[batches[0]][-1].first_tokens, hf_out)))
        if args.profile:
            self._profile(engine, prompts(max(batches), 7, "profile "), args.output_len)

        hf_tps = hf_tokens / hf_seconds if hf_seconds else float("nan")
        rows: list[list[object]] = []
        notes: list[str] = []
        if hf_model is None:
            notes.append(f"{args.model} has no HF transformers twin: no baseline, no ratios")
        else:
            rows.append(["HF generate, 1 at a time", 1, hf_tokens, hf_seconds, hf_tps, "-",
                         hf_seconds * 1e3 / hf_tokens, 1.0])
            notes.append(f"request 0 at batch {batches[0]}: leading greedy tokens equal to HF's, per round "
                         f"(of {args.output_len}): {', '.join(agree)}")
        summary: dict[str, object] = {} if hf_model is None else {"baseline_tokens_per_s": hf_tps}
        ratios: dict[int, float] = {}
        for batch, runs in ours.items():
            rates = sorted(run.tokens / run.seconds for run in runs)
            run = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]  # the median run
            decode_ms = (run.seconds - run.first_step_s) * 1e3 / max(1, run.steps - 1)
            rows.append([f"LLMEngine, batch {batch}", batch, run.tokens, run.seconds, run.tokens / run.seconds,
                         f"{rates[0]:.1f}-{rates[-1]:.1f}", decode_ms, (run.tokens / run.seconds) / hf_tps])
            if hf_model is not None:
                ratios[batch] = summary[f"ratio_at_batch_{batch}"] = (run.tokens / run.seconds) / hf_tps
        if GOAL_BATCH in ours and hf_model is not None:
            summary.update({"goal_ratio": GOAL_RATIO, "goal_met": ratios[GOAL_BATCH] >= GOAL_RATIO})
        notes.append("LLMEngine rows: the median of the rounds; ms/step is per decode step (after the "
                     "prefill step); HF row: all rounds together, ms per token")
        return BenchResult(
            name="engine-throughput",
            columns=["system", "batch", "out tokens", "seconds", "tok/s", "tok/s range", "ms/step", "vs HF"],
            rows=rows,
            summary=summary,
            notes=notes,
            params={k: v for k, v in vars(args).items() if k not in ("command", "out_dir")},
        )

    @staticmethod
    def _profile(engine: LLMEngine, prompts: list[list[int]], output_len: int) -> None:
        progress(f"cProfile of one more run at batch {len(prompts)} (top 20 functions by own time):")
        profiler = cProfile.Profile()
        profiler.enable()
        run_batch(engine, prompts, output_len, "profile")
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
        print(text.getvalue())
