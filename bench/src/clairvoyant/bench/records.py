"""What a run (simulated or live) records per call and per workflow; metrics are computed from these."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CallResult:
    """One call of a run, as it went: when it became ready, was placed, started and ended, and what
    it was served (the bench's measurement, not the profiler's ``CallRecord`` input)."""

    call_id: str
    workflow_id: str
    workflow_type: str
    agent_id: str
    model: str
    prompt_tokens: int
    output_tokens: int  # requested (max_tokens with EOS ignored)
    ready_time: float  # dependencies and their tools done: the call is submitted
    tool_latency_s: float = 0.0
    worker_id: str = ""
    dispatch_time: float | None = None  # the global scheduler placed it
    start_time: float | None = None  # its first engine step began
    first_token_time: float | None = None
    end_time: float | None = None
    cached_tokens: int = 0
    generated_tokens: int = 0
    rejected: str = ""  # why the replica refused it (e.g. longer than the context window); "" = served

    @property
    def queue_s(self) -> float:
        """Ready until its first engine step (global and local queueing together)."""
        assert self.start_time is not None
        return self.start_time - self.ready_time


@dataclass
class WorkflowRecord:
    workflow_id: str
    workflow_type: str
    arrival_time: float
    calls: int
    end_time: float | None = None  # the last call (and its tool) finished
    lower_bound_s: float = 0.0  # critical path with no queueing, full prefix caching, batch 1

    @property
    def jct_s(self) -> float:
        assert self.end_time is not None
        return self.end_time - self.arrival_time


@dataclass
class RunRecords:
    calls: list[CallResult] = field(default_factory=list)
    workflows: list[WorkflowRecord] = field(default_factory=list)
    queue_depth: list[tuple[float, str, int]] = field(default_factory=list)  # (time, model, depth) on change
    preemptions: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    duration_s: float = 0.0  # first arrival to last completion (virtual or wall seconds)
