"""Workload-aware placement: how many replicas of which tensor-parallel degree each model gets
out of a GPU budget, in proportion to the work the workload is predicted to bring it.

``place`` is the pure core: per model, the predicted GPU-seconds of its work on 1, 2, ...
replicas of each valid shape (``ShapeCost``), and a budget -> a ``Placement``.
``predicted_demand`` prices a workload's sampled programs with each shape's cost model at the
batch the load gives each replica, at most its full batch (the seats, or what its KV pool holds
at the model's contexts): an efficient batch, not batch 1.  A call's prefill counts what its
model has not seen: its fresh tokens and what it reads of other models' calls.

The allocation is greedy on the bottleneck: every model starts with one replica, then the next
replica always goes to the model with the most predicted GPU-seconds per GPU it holds, among
those whose replica still fits the budget.  That keeps ``max_m work_m / gpus_m`` (how long the
busiest model takes to drain its share) as low as whole replicas allow; with work that does not
depend on the batch it lands each model within one replica of its proportional share.

Shape (a choice): the degree with the fewest predicted GPU-seconds on one replica, preferring
the smallest degree within ``SHAPE_TOLERANCE`` of the fewest (smaller replicas split the budget
more finely, and a larger degree's latency gain is not what this allocates for).  A larger
degree wins where the load fills batches its bigger KV pool per GPU holds and a small one's
does not.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from clairvoyant.bench.sim.lower_bound import RooflineServiceTime, ServiceTime, lower_bound
from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel
from clairvoyant.workloads.program import Call, WorkflowProgram

SHAPE_TOLERANCE = 0.05  # a larger degree must save more than this share of GPU-seconds to be chosen


class ShapeCost(NamedTuple):
    """One valid replica shape of a model and what its predicted work costs on it."""

    tp: int  # GPUs per replica
    gpu_seconds: tuple[float, ...]  # the model's predicted work on 1, 2, ... replicas (the last repeats)

    def work(self, replicas: int) -> float:
        return self.gpu_seconds[min(replicas, len(self.gpu_seconds)) - 1]


class ModelDemand(NamedTuple):
    model: str
    shapes: tuple[ShapeCost, ...]  # the degrees that fit the model (with room for a full context)


class Placement(NamedTuple):
    replicas: dict[str, int]  # model -> replicas (at least one each)
    tp: dict[str, int]  # model -> GPUs per replica
    gpu_seconds: dict[str, float]  # model -> predicted work on its chosen shape and replicas

    @property
    def gpus(self) -> int:
        return sum(self.replicas[model] * self.tp[model] for model in self.replicas)

    def summary(self) -> dict[str, dict[str, float]]:
        """The results file's ``placement`` entry: per model, replicas, degree and predicted work."""
        return {
            model: {
                "replicas": self.replicas[model],
                "tp": self.tp[model],
                "gpu_seconds": self.gpu_seconds[model],
            }
            for model in sorted(self.replicas)
        }


def _shape(demand: ModelDemand) -> ShapeCost:
    fewest = min(shape.work(1) for shape in demand.shapes)
    return min(
        (shape for shape in demand.shapes if shape.work(1) <= fewest * (1 + SHAPE_TOLERANCE)),
        key=lambda shape: shape.tp,
    )


def _check(demands: Sequence[ModelDemand], gpu_budget: int) -> None:
    if not demands:
        raise ValueError("placement needs at least one model")
    if len(demands) > gpu_budget:
        raise ValueError(f"a budget of {gpu_budget} GPUs cannot give each of {len(demands)} models a replica")
    names = [demand.model for demand in demands]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"models named twice: {twice}")
    for demand in demands:
        if not demand.shapes:
            raise ValueError(f"model {demand.model!r} has no replica shape that fits")
        for shape in demand.shapes:
            if shape.tp < 1 or not shape.gpu_seconds or not min(shape.gpu_seconds) >= 0:
                raise ValueError(
                    f"model {demand.model!r}: bad shape {shape} (need tp >= 1, gpu_seconds >= 0)"
                )


def place(demands: Sequence[ModelDemand], gpu_budget: int) -> Placement:
    """Replicas and degree per model, at most ``gpu_budget`` GPUs in all, one replica at least each.

    Raises ValueError for no models, a model named twice or without a shape, a negative cost, or
    a budget too small for one replica of every model (each at its smallest degree)."""
    _check(demands, gpu_budget)
    chosen = {demand.model: _shape(demand) for demand in demands}
    if sum(shape.tp for shape in chosen.values()) > gpu_budget:  # fall back to the smallest replicas
        chosen = {demand.model: min(demand.shapes, key=lambda shape: shape.tp) for demand in demands}
    first = sum(shape.tp for shape in chosen.values())
    if first > gpu_budget:
        shapes = ", ".join(f"{model} x{shape.tp}" for model, shape in sorted(chosen.items()))
        raise ValueError(
            f"a budget of {gpu_budget} GPUs is below one replica of each model ({shapes}: {first})"
        )
    replicas = dict.fromkeys(chosen, 1)
    free = gpu_budget - first
    while True:
        fitting = [model for model, shape in chosen.items() if shape.tp <= free]
        if not fitting:
            break
        # The bottleneck: most work per GPU held; ties to the model with more work, then by name.
        model = max(fitting, key=lambda m: (_per_gpu(chosen[m], replicas[m]), chosen[m].work(1), m))
        replicas[model] += 1
        free -= chosen[model].tp
    return Placement(
        replicas, {m: s.tp for m, s in chosen.items()}, {m: s.work(replicas[m]) for m, s in chosen.items()}
    )


def _per_gpu(shape: ShapeCost, replicas: int) -> float:
    """The model's load per GPU: its work at the batch ``replicas`` replicas run, over their GPUs."""
    return shape.work(replicas) / (shape.tp * replicas)


# ---- predicted demand ----------------------------------------------------------------------------


class EfficientBatch(NamedTuple):
    """A replica shape as demand is priced on it: its cost model and how many calls it can batch."""

    cost: CostModel
    seats: int  # sequences per step (max_num_seqs)
    kv_tokens: int  # the replica's KV pool
    prefill_tokens_per_s: float  # one full prefill chunk's throughput

    def full_batch(self, context_tokens: float) -> int:
        """The most calls of ``context_tokens`` each it runs at once: its seats, or what its pool holds."""
        return max(1, min(self.seats, int(self.kv_tokens // max(1.0, context_tokens))))


def prefilled_tokens(program: WorkflowProgram, call: Call) -> int:
    """The prompt tokens a call's model has not cached: its ``new`` tokens and what it reads of
    calls another model served (a response generated elsewhere is prefilled here).  System
    prompts and the model's own earlier calls count as cached."""
    tokens = 0
    for segment in call.prompt:
        if segment.kind == "new" or (
            segment.kind == "call" and program.call(segment.call_id).model != call.model
        ):
            tokens += segment.tokens
    return max(1, tokens)


def call_gpu_seconds(call: Call, prefill_tokens: int, shape: EfficientBatch, batch: int) -> float:
    """GPU-seconds of one call: ``prefill_tokens`` at the chunk's prefill throughput, its decodes
    as a 1/batch share of a step of ``batch`` decodes at the call's mid-output context."""
    prefill = prefill_tokens / shape.prefill_tokens_per_s
    context = call.prompt_tokens + call.output_tokens // 2
    step = _decode_step(shape.cost, batch, context // CONTEXT_BUCKET * CONTEXT_BUCKET)
    return (prefill + max(0, call.output_tokens - 1) * step / batch) * shape.cost.tp


CONTEXT_BUCKET = 128  # contexts priced to this many tokens (below: a few % of a step at most)


@functools.lru_cache(maxsize=1 << 16)
def _decode_step(cost: CostModel, batch: int, context: int) -> float:
    return cost.step_cost([BatchItem(1, context)] * batch).seconds


def _batch_one(shapes: Mapping[str, Sequence[EfficientBatch]]) -> dict[str, ServiceTime]:
    return {model: RooflineServiceTime(options[0].cost) for model, options in shapes.items()}


def mean_critical_path(
    programs: Sequence[WorkflowProgram], shapes: Mapping[str, Sequence[EfficientBatch]]
) -> float:
    """The programs' mean ``lower_bound`` on each model's first shape (their JCT with no queueing)."""
    service = _batch_one(shapes)
    return sum(lower_bound(program, service) for program in programs) / len(programs) if programs else 0.0


def calls_in_flight(
    programs: Sequence[WorkflowProgram], shapes: Mapping[str, Sequence[EfficientBatch]]
) -> dict[str, float]:
    """Per model, its calls running at once per workflow in flight, with no queueing: the
    batch-1 seconds of its calls over the workflows' critical paths (``lower_bound``)."""
    service = _batch_one(shapes)
    paths = sum(lower_bound(program, service) for program in programs)
    busy = dict.fromkeys(shapes, 0.0)
    for program in programs:
        for call in program.calls:
            fresh = prefilled_tokens(program, call)
            busy[call.model] += service[call.model].call_seconds(
                fresh, call.prompt_tokens - fresh, call.output_tokens
            )
    return {model: seconds / paths if paths else 0.0 for model, seconds in busy.items()}


def predicted_demand(
    programs: Sequence[WorkflowProgram],
    shapes: Mapping[str, Sequence[EfficientBatch]],
    *,
    workflows_in_flight: float | None = None,
    max_replicas: int = 1,
) -> list[ModelDemand]:
    """Per model in ``shapes`` (model -> its valid shapes), the GPU-seconds ``programs`` bring it
    on 1 .. ``max_replicas`` replicas of each shape.  With ``workflows_in_flight`` the decodes
    are priced at the batch that load gives each replica (``calls_in_flight`` x workflows /
    replicas, at least 1): small batches read the weights for few tokens each.  The batch is at
    most the shape's full batch at the model's mean decode context (its seats, or what its KV
    pool holds), which is also the price without ``workflows_in_flight``: a replica's best
    throughput, so a small model that batches many calls is cheap per token where a large one
    whose pool fills first is not.  A model no program calls has zero demand (it still gets a
    replica)."""
    calls = [(call, prefilled_tokens(program, call)) for program in programs for call in program.calls]
    unknown = sorted({call.model for call, _ in calls} - set(shapes))
    if unknown:
        raise ValueError(f"programs call models with no shape: {unknown}")
    if max_replicas < 1:
        raise ValueError(f"max_replicas must be >= 1, got {max_replicas}")
    running = calls_in_flight(programs, shapes) if workflows_in_flight is not None else {}
    demands = []
    for model, options in sorted(shapes.items()):
        mine = [(call, fresh) for call, fresh in calls if call.model == model]
        decoded = sum(call.output_tokens for call, _ in mine)
        context = sum(call.output_tokens * (call.prompt_tokens + call.output_tokens / 2) for call, _ in mine)
        costs = []
        for option in options:
            full = option.full_batch(context / decoded if decoded else 1.0)
            if workflows_in_flight is None:
                batches = [full]
            else:
                active = running[model] * workflows_in_flight
                batches = [min(full, max(1, round(active / r))) for r in range(1, max_replicas + 1)]
            work = tuple(
                sum(call_gpu_seconds(call, fresh, option, batch) for call, fresh in mine) for batch in batches
            )
            costs.append(ShapeCost(option.cost.tp, work))
        demands.append(ModelDemand(model, tuple(costs)))
    return demands
