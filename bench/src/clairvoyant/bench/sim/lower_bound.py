"""The critical-path lower bound of a workflow's JCT.

No queueing, full prefix caching (every token a prompt shares with a system prompt or an earlier
call is already cached: only "new" segments are prefilled) and batch-1 speed, tools included::

    finish(call) = max(finish(dep) + tool(dep) for dep in call.dependencies) + service(call)
    bound        = max(finish(call) + tool(call)) - arrival

A call's decode steps are costed at the context length halfway through its output: the roofline
of one decode item is linear in the context, so this is exact unless the step crosses from
memory-bound to compute-bound mid-call (it does not for single-item decodes).
"""

from __future__ import annotations

from typing import Protocol

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
