"""``constrained``: LLMEngine's decode throughput with a JSON Schema constraint vs free text, same
prompts, same output lengths, at batch 8 and 32.

A round at batch ``B``: ``B`` distinct chat prompts asking for a person as JSON.  The constrained
run samples under the schema (each output ends when its JSON does, or at ``--max-tokens``); the
free run then generates exactly as many tokens per request (``max_tokens`` = that length,
``ignore_eos``), so both runs decode the same token counts over the same prompts.  Rounds
alternate the two, so a slow phase of a shared machine hits both sides of the ratio, and each
round first prefills its prompts into the prefix cache, so both runs find them there::

    round 1: prefill(B=8) constrained(B=8) free(B=8) prefill(B=32) constrained(B=32) free(B=32)
    round 2: ...

Where the time goes is measured by timing the runner's ``forward`` and the engine's
``masks.fill`` / ``masks.apply`` inside the timed runs; the rest of a step is sampling, the
matchers' ``accept_token`` and the engine's bookkeeping.  The grammar is compiled (and timed) once
before the rounds: every request then finds it in the cache, as repeated schemas do in a server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema
import torch

from clairvoyant.bench.common import BENCHMARKS, BenchResult, progress
from clairvoyant.bench.models import MODELS, SMOLLM2, TINY, load_ours
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.runners.torch_runner import TorchRunner

GOAL_SLOWDOWN = 0.10  # constrained at most 10 % slower than free text
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "skills": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "minItems": 3,
            "maxItems": 3,
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "skills", "active"],
    "additionalProperties": False,
}


@dataclass
class Timers:
    """Seconds spent in each wrapped call since the last ``reset``."""

    seconds: dict[str, float] = field(default_factory=dict)

    def wrap(self, owner: object, method: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, method, timed)

    def reset(self) -> None:
        self.seconds = {}


@dataclass(frozen=True)
class Run:
    tokens: int
    seconds: float
    steps: int
    lengths: list[int]  # output tokens per request, in submission order
    texts: list[str]
    finish_reasons: list[str]
    split: dict[str, float]  # seconds per timed part (forward, mask fill, mask apply)


def chat_prompts(runner: TorchRunner, count: int, tag: str) -> list[list[int]]:
    return [
        runner.tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": f"{tag} #{i}: describe person {i} as JSON: name, age, city, skills, active.",
                }
            ]
        )
        for i in range(count)
    ]


def run_batch(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], tag: str, timers: Timers
) -> Run:
    timers.reset()
    start = time.perf_counter()
    for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(EngineRequest(f"{tag}-{i}", prompt, sampling))
    lengths, texts, reasons = [0] * len(prompts), [""] * len(prompts), [""] * len(prompts)
    steps = 0
    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            i = int(out.request_id.rsplit("-", 1)[1])
            lengths[i] += len(out.new_token_ids)
            texts[i] += out.new_text
            if out.finished:
                reasons[i] = out.finish_reason or ""
    seconds = time.perf_counter() - start
    return Run(sum(lengths), seconds, steps, lengths, texts, reasons, dict(timers.seconds))


def parses(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def load_model(name: str) -> tuple[TorchRunner, str]:
    """``name``'s runner; tiny-random when SmolLM2's weights are not installed."""
    try:
        return load_ours(name, max_model_len=1024), name
    except ValueError as exc:
        if name == TINY:
            raise
        progress(f"{name} does not load ({exc}); falling back to {TINY}")
        return load_ours(TINY, max_model_len=1024), TINY


@BENCHMARKS.register("constrained")
class Constrained:
    help = (
        "decode tokens/s with a JSON Schema constraint vs free text, same prompts and lengths, batch 8 and 32"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model", choices=MODELS, default=SMOLLM2)
        parser.add_argument("--batches", default="8,32", help="comma-separated batch sizes")
        parser.add_argument("--max-tokens", type=int, default=128, help="cap on each constrained output")
        parser.add_argument("--repeats", type=int, default=3, help="rounds (each: every batch, both ways)")
        parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
        parser.add_argument("--temperature", type=float, default=0.7)
        parser.add_argument("--quick", action="store_true", help="1 round")

    def run(self, args: argparse.Namespace) -> BenchResult:
        torch.set_num_threads(args.threads)
        if args.quick:
            args.repeats = 1
        batches = [int(b) for b in args.batches.split(",")]
        progress(f"loading {args.model}; torch threads = {torch.get_num_threads()}")
        runner, model = load_model(args.model)
        engine = LLMEngine(
            runner,
            EngineConfig(
                block_size=16,
                num_blocks=max(batches) * (-(-(80 + args.max_tokens) // 16)) * 2 + 64,
                max_num_seqs=max(batches),
                max_num_batched_tokens=max(2048, max(batches) * 80),
            ),
        )
        constraint = OutputConstraint.of_schema(PERSON_SCHEMA)
        start = time.perf_counter()
        engine.grammars.compile(constraint)
        compile_s = time.perf_counter() - start  # includes building the vocabulary for xgrammar
        timers = Timers()
        timers.wrap(engine.runner, "forward", "forward")
        timers.wrap(engine.masks, "fill", "mask fill")
        timers.wrap(engine.masks, "apply", "mask apply")

        def constrained_params(count: int, seed: int) -> list[SamplingParams]:
            return [
                SamplingParams(
                    max_tokens=args.max_tokens,
                    temperature=args.temperature,
                    seed=seed + i,
                    constraint=constraint,
                )
                for i in range(count)
            ]

        def free_params(lengths: list[int], seed: int) -> list[SamplingParams]:
            return [
                SamplingParams(max_tokens=n, temperature=args.temperature, seed=seed + i, ignore_eos=True)
                for i, n in enumerate(lengths)
            ]

        progress("warm-up ...")
        for batch in batches:
            warm = chat_prompts(runner, batch, "warm-up")
            params = [replace(p, max_tokens=16) for p in constrained_params(batch, 0)]
            run = run_batch(engine, warm, params, f"wc{batch}", timers)
            run_batch(engine, warm, free_params(run.lengths, 0), f"wf{batch}", timers)

        runs: dict[tuple[int, str], list[Run]] = {
            (b, kind): [] for b in batches for kind in ("constrained", "free")
        }
        for r in range(args.repeats):
            for batch in batches:
                prompts = chat_prompts(runner, batch, f"round {r} batch {batch}")
                seed = 1000 * r
                # Prefill the prompts into the prefix cache first: both timed runs then find them
                # there alike, and time (almost only) decoding.
                run_batch(
                    engine,
                    prompts,
                    [SamplingParams(max_tokens=1, temperature=0.0)] * batch,
                    f"p{r}b{batch}",
                    timers,
                )
                constrained_run = run_batch(
                    engine, prompts, constrained_params(batch, seed), f"c{r}b{batch}", timers
                )
                free_run = run_batch(
                    engine, prompts, free_params(constrained_run.lengths, seed), f"f{r}b{batch}", timers
                )
                runs[(batch, "constrained")].append(constrained_run)
                runs[(batch, "free")].append(free_run)
                progress(
                    f"round {r + 1}: batch {batch}: constrained {constrained_run.tokens / constrained_run.seconds:.1f} "
                    f"tok/s, free {free_run.tokens / free_run.seconds:.1f} tok/s"
                )
        return self._result(args, model, batches, runs, compile_s)

    @staticmethod
    def _result(
        args: argparse.Namespace,
        model: str,
        batches: list[int],
        runs: dict[tuple[int, str], list[Run]],
        compile_s: float,
    ) -> BenchResult:
        rows: list[list[object]] = []
        summary: dict[str, object] = {
            "model": model,
            "compile_ms": compile_s * 1e3,
            "goal_slowdown": GOAL_SLOWDOWN,
        }
        for batch in batches:
            rates = {}
            non_forward_ms: dict[str, float] = {}
            for kind in ("constrained", "free"):
                kind_runs = runs[(batch, kind)]
                tps = [run.tokens / run.seconds for run in kind_runs]
                rates[kind] = statistics.median(tps)
                total = sum(run.seconds for run in kind_runs)
                steps = sum(run.steps for run in kind_runs)
                split = {
                    part: sum(run.split.get(part, 0.0) for run in kind_runs)
                    for part in ("forward", "mask fill", "mask apply")
                }
                other = total - sum(split.values())
                non_forward_ms[kind] = (total - split["forward"]) * 1e3 / steps
                rows.append([
                    kind, batch, sum(run.tokens for run in kind_runs), total, rates[kind],
                    total * 1e3 / steps, split["forward"] * 1e3 / steps, split["mask fill"] * 1e3 / steps,
                    split["mask apply"] * 1e3 / steps, other * 1e3 / steps,
                ])  # fmt: skip
                if kind == "constrained":
                    texts = [text for run in kind_runs for text in run.texts]
                    reasons = [reason for run in kind_runs for reason in run.finish_reasons]
                    summary[f"parsed_fraction_at_batch_{batch}"] = sum(map(parses, texts)) / len(texts)
                    summary[f"stopped_fraction_at_batch_{batch}"] = reasons.count("stop") / len(reasons)
                    summary[f"mask_ms_per_step_at_batch_{batch}"] = (
                        (split["mask fill"] + split["mask apply"]) * 1e3 / steps
                    )
            # Each round's constrained and free runs are a pair: the median of their ratios.
            ratio = statistics.median(
                (c.tokens / c.seconds) / (f.tokens / f.seconds)
                for c, f in zip(runs[(batch, "constrained")], runs[(batch, "free")], strict=True)
            )
            free_runs = runs[(batch, "free")]
            free_ms_per_step = (
                sum(run.seconds for run in free_runs) * 1e3 / sum(run.steps for run in free_runs)
            )
            overhead_ms = non_forward_ms["constrained"] - non_forward_ms["free"]
            summary[f"constrained_tokens_per_s_at_batch_{batch}"] = rates["constrained"]
            summary[f"free_tokens_per_s_at_batch_{batch}"] = rates["free"]
            summary[f"ratio_at_batch_{batch}"] = ratio
            summary[f"slowdown_at_batch_{batch}"] = 1.0 - ratio
            summary[f"goal_met_at_batch_{batch}"] = 1.0 - ratio <= GOAL_SLOWDOWN
            summary[f"overhead_ms_per_step_at_batch_{batch}"] = overhead_ms
            summary[f"overhead_vs_free_step_at_batch_{batch}"] = overhead_ms / free_ms_per_step
        notes = [
            "tok/s: the median round; the other columns: all rounds together, per engine step",
            "ratio: the median over rounds of constrained tok/s / free tok/s in the same round",
            "overhead_ms_per_step: (step - forward) constrained minus (step - forward) free, per step; "
            "the forward is the same work on both sides, so this is the constraint's cost without "
            "the machine's noise in the forward; overhead_vs_free_step: that over a free step's time",
            "other ms/step = step time - forward - mask fill - mask apply: sampling, accept_token, "
            "the masked logits' copy, detokenizing and the engine's bookkeeping",
            "free text generates each request's constrained length exactly (ignore_eos)",
            f"model: {model}; compile_ms includes building xgrammar's vocabulary once",
        ]
        return BenchResult(
            name=f"constrained-{'smollm2' if model == SMOLLM2 else model}",
            columns=[
                "decoding",
                "batch",
                "out tokens",
                "seconds",
                "tok/s",
                "ms/step",
                "forward ms",
                "mask fill ms",
                "mask apply ms",
                "other ms",
            ],
            rows=rows,
            summary=summary,
            notes=notes,
            params={k: v for k, v in vars(args).items() if k not in ("command", "out_dir")},
        )
