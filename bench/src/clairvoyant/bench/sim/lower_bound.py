"""Lower bounds of JCT: the critical path of each workflow, and the cluster's capacity on the mean.

No queueing, full prefix caching (every token a prompt shares with a system prompt or an earlier
call is already cached: only "new" segments are prefilled) and batch-1 speed, tools included::

    finish(call) = max(finish(dep) + tool(dep) for dep in call.dependencies) + service(call)
    bound        = max(finish(call) + tool(call)) - arrival

A call's decode steps are costed at the context length halfway through its output: the roofline
of one decode item is linear in the context, so this is exact unless the step crosses from
memory-bound to compute-bound mid-call (it does not for single-item decodes).

The capacity bound (``capacity_bound``) is on the mean JCT of a run: SRPT on one server as fast
as the cluster, each workflow's size its work at the engine's peak efficiency (``PeakWork``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from clairvoyant.worker.costmodel.roofline import BatchItem, CostModel
from clairvoyant.workloads.program import Call, WorkflowProgram


class ServiceTime(Protocol):
    def call_seconds(self, fresh_tokens: int, reused_tokens: int, output_tokens: int) -> float: ...


class UnitServiceTime:
    """Unit-time mode: one step per output token, prefill free."""

    def call_seconds(self, fresh_tokens: int, reused_tokens: int, output_tokens: int) -> float:
        return float(output_tokens)


class RooflineServiceTime:
    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def call_seconds(self, fresh_tokens: int, reused_tokens: int, output_tokens: int) -> float:
        # The prefill step also samples the first output token.
        prefill = self.cost.step_cost([BatchItem(max(1, fresh_tokens), reused_tokens)]).seconds
        decodes = output_tokens - 1
        if decodes <= 0:
            return prefill
        context = fresh_tokens + reused_tokens + output_tokens // 2
        return prefill + decodes * self.cost.step_cost([BatchItem(1, context)]).seconds


def fresh_and_reused(call: Call) -> tuple[int, int]:
    fresh = sum(seg.tokens for seg in call.prompt if seg.kind == "new")
    return fresh, call.prompt_tokens - fresh


def lower_bound(program: WorkflowProgram, service: dict[str, ServiceTime]) -> float:
    """Seconds; ``service`` maps each model name to its batch-1 service time."""
    finish: dict[str, float] = {}
    end = 0.0
    for call in program.calls:  # topological order
        start = max((finish[d] + program.call(d).tool_latency_s for d in call.dependencies), default=0.0)
        fresh, reused = fresh_and_reused(call)
        finish[call.call_id] = start + service[call.model].call_seconds(fresh, reused, call.output_tokens)
        end = max(end, finish[call.call_id] + call.tool_latency_s)
    return end


# ---- the capacity bound ------------------------------------------------------------------------


class PeakWork:
    """The fewest GPU-seconds any schedule of the emulated engine spends on one call of a model
    served by replicas of ``cost``'s shape.

    A step of ``items`` takes ``max(c, m) + (1 - o) min(c, m) + comm + overhead`` (roofline.py),
    which is at least ``(1 - o/2)(c + m) + comm + overhead``.  ``c`` (FLOPs), the KV part of ``m``
    and the token part of ``comm`` are sums over the items.  The rest (the weights read, the
    all-reduce latency, the step overhead) is paid once per step and shared among its items in
    one of two ways, each never charging a step more than it costs:

    - ``per_seat(cost, max_num_seqs)``: a step holds at most ``max_num_seqs`` items, so each is
      charged ``1 / max_num_seqs`` of it;
    - ``per_kv_token(cost, kv_pool_tokens)``: each item is charged its share of the replica's KV
      pool, ``u / kv_pool_tokens``, where ``u`` counts its tokens no other sequence holds (its
      ``new`` prompt tokens and its output so far; distinct token ids, so in blocks of its own).
      The items of a step are all in the pool at once, so their ``u`` add up to at most the pool.

    A call is at least one prefill item of its ``new`` tokens (full prefix caching; at least one
    token, as the engine always computes one) after its other prompt tokens, then ``output - 1``
    decode items, the ``j``-th after ``prompt + j`` tokens.  GPU-seconds: the step's seconds
    times ``tp`` (every GPU of the replica is held).
    """

    def __init__(self, cost: CostModel, *, per_item: float, per_unique_token: float) -> None:
        """Each item is charged ``per_item + per_unique_token * u`` of a step's fixed cost."""
        self.cost = cost
        gpu = cost.gpu
        self._compute_rate = gpu.bf16_flops * gpu.mfu
        self._memory_rate = gpu.hbm_bandwidth * gpu.mbu
        self._weights_bytes = cost.model.streamed_weight_bytes / cost.tp
        self._busy_share = 1.0 - cost.overlap / 2.0
        per_step = self._busy_share * self._weights_bytes / self._memory_rate + gpu.step_overhead
        if cost.tp > 1:
            per_step += 2 * cost.model.layers * gpu.allreduce_latency
        self._per_item_s = per_step * per_item
        self._per_unique_token_s = per_step * per_unique_token

    @classmethod
    def per_seat(cls, cost: CostModel, max_num_seqs: int) -> PeakWork:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        return cls(cost, per_item=1.0 / max_num_seqs, per_unique_token=0.0)

    @classmethod
    def per_kv_token(cls, cost: CostModel, kv_pool_tokens: int) -> PeakWork:
        if kv_pool_tokens < 1:
            raise ValueError(f"kv_pool_tokens must be >= 1, got {kv_pool_tokens}")
        return cls(cost, per_item=0.0, per_unique_token=1.0 / kv_pool_tokens)

    def _items_seconds(self, items: int, flops: float, kv_bytes: float, tokens: int, unique: float) -> float:
        """The charge of ``items`` items computing ``tokens`` tokens, holding ``unique`` own
        tokens between them, per GPU."""
        busy = self._busy_share * (flops / self._compute_rate + kv_bytes / self._memory_rate)
        comm = (
            self.cost.allreduce_seconds(tokens) - self.cost.allreduce_seconds(0) if self.cost.tp > 1 else 0.0
        )
        return busy + comm + items * self._per_item_s + unique * self._per_unique_token_s

    def _flops_and_kv(self, item: BatchItem) -> tuple[float, float]:
        step = self.cost.step_cost([item])
        return step.flops, step.bytes - self._weights_bytes

    def call_gpu_seconds(self, fresh_tokens: int, reused_tokens: int, output_tokens: int) -> float:
        prompt = fresh_tokens + reused_tokens
        new = max(1, fresh_tokens)
        flops, kv_bytes = self._flops_and_kv(BatchItem(new, max(0, prompt - new)))
        seconds = self._items_seconds(1, flops, kv_bytes, new, fresh_tokens)
        decodes = output_tokens - 1
        if decodes > 0:
            # Each decode's FLOPs, KV bytes and own tokens are linear in j: sum them in closed form.
            first_flops, first_kv = self._flops_and_kv(BatchItem(1, prompt))
            next_flops, next_kv = self._flops_and_kv(BatchItem(1, prompt + 1))
            steps_after_first = decodes * (decodes - 1) / 2
            flops = decodes * first_flops + (next_flops - first_flops) * steps_after_first
            kv_bytes = decodes * first_kv + (next_kv - first_kv) * steps_after_first
            unique = decodes * (fresh_tokens + 1) + steps_after_first  # sum over j of fresh + j + 1
            seconds += self._items_seconds(decodes, flops, kv_bytes, decodes, unique)
        return seconds * self.cost.tp


def srpt_completions(jobs: Sequence[tuple[float, float]], speed: float = 1.0) -> list[float]:
    """Each job's completion time, in ``jobs``' order, when one server of ``speed`` runs ``jobs``
    (arrival, size) by shortest remaining processing time, preemptively.

    SRPT leaves the fewest jobs in the system at every instant of any preemptive schedule of one
    server, processor sharing included (Schrage 1968; Smith 1978), so its k-th completion is no
    later than any such schedule's k-th, and its mean response is the least."""
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    if any(size < 0 for _, size in jobs):
        raise ValueError(f"job sizes must be >= 0, got {min(size for _, size in jobs)}")
    order = sorted(range(len(jobs)), key=lambda job: jobs[job])
    completions = [0.0] * len(jobs)
    remaining: list[tuple[float, int]] = []  # heap of (remaining seconds at speed, job)
    now, position = 0.0, 0
    while position < len(order) or remaining:
        if not remaining:
            now = max(now, jobs[order[position]][0])
        while position < len(order) and jobs[order[position]][0] <= now:
            job = order[position]
            heapq.heappush(remaining, (jobs[job][1] / speed, job))
            position += 1
        left, job = heapq.heappop(remaining)
        until = jobs[order[position]][0] if position < len(order) else float("inf")
        if now + left <= until:
            now += left
            completions[job] = now
        else:
            heapq.heappush(remaining, (left - (until - now), job))
            now = until
    return completions


def srpt_mean_response(jobs: Sequence[tuple[float, float]], speed: float = 1.0) -> float:
    """Mean of (completion - arrival) of ``srpt_completions``; 0 for no jobs."""
    if not jobs:
        return 0.0
    completions = srpt_completions(jobs, speed)
    return sum(done - arrival for done, (arrival, _) in zip(completions, jobs, strict=True)) / len(jobs)


def _work_by_model(program: WorkflowProgram, work: Mapping[str, PeakWork]) -> dict[str, float]:
    by_model: dict[str, float] = {}
    for call in program.calls:
        fresh, reused = fresh_and_reused(call)
        seconds = work[call.model].call_gpu_seconds(fresh, reused, call.output_tokens)
        by_model[call.model] = by_model.get(call.model, 0.0) + seconds
    return by_model


class CapacityBounds(NamedTuple):
    """Two lower bounds on a run's MEAN JCT (``capacity_bound``)."""

    capacity_s: float  # SRPT's mean response on the fastest server(s) the cluster could be
    limit_s: float  # that and each workflow's critical-path bound together (>= both means)


def capacity_bound(
    workflows: Sequence[tuple[float, WorkflowProgram]],
    work: Mapping[str, PeakWork],
    *,
    total_gpus: int,
    gpus_by_model: Mapping[str, int] | None = None,
    critical_paths: Sequence[float] | None = None,
) -> CapacityBounds:
    """Lower bounds on the MEAN JCT of ``workflows`` (arrival time, program) on a cluster of at
    most ``total_gpus`` GPUs, whatever its scheduling; with ``gpus_by_model`` (a fixed placement:
    model -> the GPUs of its replicas) also per model; ``critical_paths``: each workflow's
    ``lower_bound`` (default 0).

    Why they hold: let ``W_i`` be workflow i's work, ``work[call.model].call_gpu_seconds`` summed
    over its calls (either sharing of ``PeakWork``; each gives bounds, so take the larger).
    However the cluster runs, in any interval of length t it does at most ``G t`` of that work
    (``PeakWork``: no step does a call's share in fewer GPU-seconds).  So running the same work at
    the same rates on one server of speed ``G`` is a schedule of that server in which each
    workflow finishes no later than in the cluster (where it also waits on tools and
    dependencies).  SRPT's k-th completion on that server is no later than that schedule's k-th
    (``srpt_completions``), so SRPT's mean response is at most the cluster's mean JCT: a bound
    on the mean, not on any one workflow.

    The limit adds the critical path ``L_i`` (workflow i ends no earlier than ``a_i + L_i``):
    whatever order the cluster finishes the workflows in, the one finishing k-th ends no earlier
    than both SRPT's k-th completion ``s_k`` and its own ``a_i + L_i``, so the sum of completions
    is at least ``min over orders of sum max(a_i + L_i, s_k)``, which pairs the two sorted lists
    (``max(x, y) = (x + y + |x - y|) / 2``, and sorted pairing minimises the sum of ``|x - y|``).
    It is at least the larger of the two means.

    Per model the same holds for model m's work alone on a server of speed ``G_m``: a workflow is
    done no earlier than its model-m work; workflows with none keep ``a_i + L_i`` alone.  Each
    bound is the largest over the aggregate server and the per-model ones.  Arrivals are as they
    happened (closed loop: that run's own arrivals)."""
    if total_gpus < 1:
        raise ValueError(f"total_gpus must be >= 1, got {total_gpus}")
    if critical_paths is not None and len(critical_paths) != len(workflows):
        raise ValueError(f"{len(critical_paths)} critical paths for {len(workflows)} workflows")
    if not workflows:
        return CapacityBounds(0.0, 0.0)
    missing = {call.model for _, program in workflows for call in program.calls} - set(work)
    if missing:
        raise ValueError(f"no peak work for models {sorted(missing)}")
    sizes = [_work_by_model(program, work) for _, program in workflows]
    arrivals = [arrival for arrival, _ in workflows]
    earliest = [a + path for a, path in zip(arrivals, critical_paths or [0.0] * len(arrivals), strict=True)]
    servers = [(list(range(len(workflows))), [sum(size.values()) for size in sizes], total_gpus)]
    for model, gpus in sorted((gpus_by_model or {}).items()):
        if gpus < 1:
            raise ValueError(f"model {model!r} has {gpus} GPUs; a placed model needs at least one")
        mine = [i for i, size in enumerate(sizes) if size.get(model)]
        servers.append((mine, [sizes[i][model] for i in mine], gpus))
    capacity = limit = 0.0
    for members, work_s, gpus in servers:
        completions = srpt_completions([(arrivals[i], w) for i, w in zip(members, work_s, strict=True)], gpus)
        response = sum(done - arrivals[i] for i, done in zip(members, completions, strict=True))
        capacity = max(capacity, response / len(workflows))
        ends = sorted(earliest[i] for i in members)
        paired = sum(max(end, done) for end, done in zip(ends, sorted(completions), strict=True))
        others = sum(earliest) - sum(ends)  # workflows with no work on this server
        limit = max(limit, (paired + others - sum(arrivals)) / len(workflows))
    return CapacityBounds(capacity, limit)
