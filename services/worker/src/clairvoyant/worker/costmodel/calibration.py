"""Published bf16/fp16 serving numbers and what ``CostModel`` predicts for each.

Run ``python -m clairvoyant.worker.costmodel.calibration`` to print the table in docs/costmodel.md;
tests/worker/test_emulated_costmodel.py holds every point without a caveat to ``TOLERANCE``.

Three kinds of measurement, each replayed step by step through ``CostModel.step_cost``:

- ``ttft``: one request of ``input_len`` tokens, batch 1: the latency of its prefill step.
- ``static``: a static batch (TensorRT-LLM's gptSessionBenchmark): ``batch`` prompts prefilled in one
  step, then ``output_len - 1`` decode steps of the whole batch.  Output tokens/s per GPU.
- ``steady``: an offline continuous-batching run (all requests queued at once) in its steady state:
  ``batch`` running sequences of mean lengths ``input_len``/``output_len``; each cycle prefills
  ``batch`` prompts (whole prompts, at most ``prefill_budget`` tokens per step) and decodes
  ``output_len - 1`` tokens each at the mean context.  Output tokens/s of the replica.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from clairvoyant.worker.costmodel.gpus import get_gpu
from clairvoyant.worker.costmodel.models import get_model
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel

TOLERANCE = 0.25  # largest accepted |predicted / published - 1|

Kind = Literal["ttft", "static", "steady"]

TRT_V05_V061 = (
    "TensorRT-LLM docs/source/performance.md (v0.5 low-latency and v0.6.1 peak-throughput tables, "
    "A100 FP16), github.com/NVIDIA/TensorRT-LLM/blob/77d24b5fa178f11ed7fafdd9833b7245e075f721/docs/source/performance.md"
)
SGLANG_V030 = (
    "vLLM v0.6.0 offline ShareGPT run in sgl-project/sglang benchmark/benchmark_vllm_060/README.md "
    "(bf16, 5000 prompts, max_num_seqs 256, mean output 194 tokens)"
)


class PublishedPoint(NamedTuple):
    source: str
    gpu: str
    model: str
    tp: int
    kind: Kind
    input_len: int
    output_len: int  # 1 for ttft
    batch: int
    published: float  # seconds for ttft; output tokens/s per GPU (static) or per replica (steady)
    unit: str
    prefill_budget: int = 0  # steady: tokens per prefill step (0: unlimited)
    caveat: str = ""  # why the point is not held to TOLERANCE (a known gap of the measured engine)


POINTS: tuple[PublishedPoint, ...] = (
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 1, "ttft", 128, 1, 1, 0.016, "s"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 1, "ttft", 2048, 1, 1, 0.133, "s"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-70b", 4, "ttft", 128, 1, 1, 0.047, "s"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-70b", 4, "ttft", 2048, 1, 1, 0.377, "s"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 1, "static", 128, 128, 384, 5586, "tok/s/GPU"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 1, "static", 128, 2048, 60, 1928, "tok/s/GPU"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 1, "static", 2048, 128, 52, 591, "tok/s/GPU"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-7b", 2, "static", 2048, 2048, 64, 782, "tok/s/GPU"),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-70b", 4, "static", 128, 128, 1280, 670, "tok/s/GPU"),
    PublishedPoint(
        TRT_V05_V061, "A100-80G", "llama-2-70b", 4, "static", 128, 2048, 240, 525, "tok/s/GPU",
        caveat="long context, large batch: KV reads dominate; likely the GQA decode kernel (XQA, "
        "experimental in v0.6.1) read K/V per query head, up to 8x the traffic modelled",
    ),
    PublishedPoint(TRT_V05_V061, "A100-80G", "llama-2-70b", 4, "static", 2048, 128, 120, 79, "tok/s/GPU"),
    # Mean ShareGPT prompt under the Llama-3 tokenizer: 215 tokens (vLLM benchmark_serving's
    # "Total input tokens: 215196" for 1000 prompts, vllm-project/vllm#7567); mean output 4132.37 /
    # 21.27 = 194 tokens from the run itself.  vLLM 0.6.0 prefills whole prompts (no chunking below
    # 32k context), up to max_num_batched_tokens = max_model_len = 4096 per step.
    PublishedPoint(SGLANG_V030, "A100-80G", "llama-3.1-8b", 1, "steady", 215, 194, 256, 4132.37, "tok/s", 4096),
    PublishedPoint(SGLANG_V030, "H100-80G", "llama-3.1-70b", 4, "steady", 215, 194, 256, 3700.64, "tok/s", 4096),
)


def _decode_steps(cost: CostModel, batch: int, first_context: int, steps: int) -> float:
    """Seconds for ``steps`` decode steps of ``batch`` sequences, the first at ``first_context`` keys."""
    return sum(cost.step_cost([BatchItem(1, first_context + k - 1)] * batch).seconds for k in range(steps))


def _prefill_steps(cost: CostModel, prompts: int, input_len: int, budget: int) -> float:
    """Seconds to prefill ``prompts`` whole prompts, packed ``budget // input_len`` per step."""
    per_step = max(1, budget // input_len) if budget else prompts
    full, rest = divmod(prompts, per_step)
    seconds = full * cost.step_cost([BatchItem(input_len)] * per_step).seconds
    return seconds + (cost.step_cost([BatchItem(input_len)] * rest).seconds if rest else 0.0)


def predict(point: PublishedPoint) -> float:
    """What the cost model says for ``point``, in the point's unit."""
    cost = CostModel(get_gpu(point.gpu), get_model(point.model), point.tp)
    if point.kind == "ttft":
        return cost.step_cost([BatchItem(point.input_len)]).seconds
    if point.kind == "static":
        seconds = _prefill_steps(cost, point.batch, point.input_len, 0)
        seconds += _decode_steps(cost, point.batch, point.input_len + 1, point.output_len - 1)
        return point.batch * point.output_len / seconds / point.tp
    mean_context = point.input_len + math.ceil(point.output_len / 2)
    decode = (point.output_len - 1) * cost.step_cost([BatchItem(1, mean_context)] * point.batch).seconds
    seconds = decode + _prefill_steps(cost, point.batch, point.input_len, point.prefill_budget)
    return point.batch * point.output_len / seconds


def relative_error(point: PublishedPoint) -> float:
    return predict(point) / point.published - 1.0


def markdown_table() -> str:
    rows = [
        "| GPU | model | TP | kind | in/out | batch | published | predicted | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        # a caveat marks the error with (*); the doc explains it
    ]
    for p in POINTS:
        scale, fmt = (1000.0, "{:.0f} ms") if p.unit == "s" else (1.0, "{:,.0f} " + p.unit)
        rows.append(
            f"| {p.gpu} | {p.model} | {p.tp} | {p.kind} | {p.input_len}/{p.output_len} | {p.batch} | "
            f"{fmt.format(p.published * scale)} | {fmt.format(predict(p) * scale)} | {relative_error(p):+.0%}"
            f"{' (*)' if p.caveat else ''} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
