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


@dataclass(frozen=True)
class KvTierTotals:
    """The engines' KV tier counters (``EngineStats``), summed over a run's replicas.

    A request's hit is counted once, at its first admission (a preempted call admitted again finds
    its own blocks, and that is not counted again; a pre-prefill is no request), so the hit ratios
    are the calls' ``cache_hit_ratio`` split by tier.
    """

    prompt_tokens: int = 0  # prompt tokens of every request the engines took
    hit_tokens: tuple[int, int, int] = (0, 0, 0)  # prompt tokens served from L1, L2, L3
    prefill_tokens_saved: int = 0  # prompt tokens served from a cache, not recomputed (any tier)
    demoted_blocks: int = 0  # L1 -> L2
    promoted_blocks: int = 0  # L2 -> L1
    l3_written_blocks: int = 0
    l3_fetched_blocks: int = 0

    def __add__(self, other: KvTierTotals) -> KvTierTotals:
        l1, l2, l3 = (a + b for a, b in zip(self.hit_tokens, other.hit_tokens, strict=True))
        return KvTierTotals(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            hit_tokens=(l1, l2, l3),
            prefill_tokens_saved=self.prefill_tokens_saved + other.prefill_tokens_saved,
            demoted_blocks=self.demoted_blocks + other.demoted_blocks,
            promoted_blocks=self.promoted_blocks + other.promoted_blocks,
            l3_written_blocks=self.l3_written_blocks + other.l3_written_blocks,
            l3_fetched_blocks=self.l3_fetched_blocks + other.l3_fetched_blocks,
        )


@dataclass(frozen=True)
class CacheManagerTotals:
    """What a run's cache manager did (simulated runs with a cache policy; else None).

    Directives are counted by kind.  Speculative tokens are those the applied speculative
    directives (promote, pre-prefill on a prediction) named, counted once per block and worker;
    used: a later call on that worker was served them from its cache; the rest were wasted."""

    policy: str
    directives_issued: dict[str, int] = field(default_factory=dict)
    directives_applied: dict[str, int] = field(default_factory=dict)
    directives_refused: dict[str, int] = field(default_factory=dict)  # by the engine, or its worker had left
    speculative_tokens: int = 0
    speculative_tokens_used: int = 0
    completions_seen: int = 0  # the core's counters at the end of the run
    events_seen: int = 0
    indexed_blocks: int = 0
    core_speculative_tokens: int = 0  # the core's own count: named by the speculative directives it issued
    core_wasted_speculative_tokens: int = 0  # of those, unused when their speculation closed

    @property
    def wasted_speculative_tokens(self) -> int:
        return self.speculative_tokens - self.speculative_tokens_used


@dataclass
class RunRecords:
    calls: list[CallResult] = field(default_factory=list)
    workflows: list[WorkflowRecord] = field(default_factory=list)
    queue_depth: list[tuple[float, str, int]] = field(default_factory=list)  # (time, model, depth) on change
    preemptions: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    kv_tiers: KvTierTotals | None = None  # the engines' tier counters (simulated runs; live: None)
    cache_manager: CacheManagerTotals | None = None  # simulated runs with a cache policy
    duration_s: float = 0.0  # first arrival to last completion (virtual or wall seconds)
    capacity_bound_avg_jct_s: float | None = None  # sim/lower_bound.capacity_bound (sim; live: None)
    limit_avg_jct_s: float | None = None  # that bound and the critical paths together (simulated runs)
