"""The industry baselines: what production routers in front of vLLM and SGLang do, and Continuum.

    vllm-prodstack  FCFS + session affinity         (vLLM production-stack router, ``session`` logic)
    sglang-gw       FCFS + cache-aware routing       (sglang-router / SGLang model gateway, ``cache_aware``)
    continuum       program-level FCFS + affinity    (Continuum, multi-turn agent scheduling on vLLM)

Both routers forward every request at once and let the engine queue it; here the calls queue at
the engine too (``EngineQueued``, ROUTER_QUEUE_FACTOR x max_batch per worker, the cap autellix-lb
uses), and only the overflow waits in the global queue, in FCFS order.  A session is the program
of the process table: (tenant, app_metadata.workflow_id).  Each class's docstring gives its
sources and the readings where the request here carries less than the real router sees.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from clairvoyant.core.blockhash import BLOCK_TOKENS
from clairvoyant.policy.capabilities import Capability
from clairvoyant.policy.presets import PRESETS, Preset
from clairvoyant.policy.process_table import ProcessTable, program_key
from clairvoyant.policy.scheduling import (
    PRIORITY_POLICIES,
    ROUTING_POLICIES,
    KvIndexView,
    PriorityChanges,
    ProgramRows,
    least_used_eligible,
)
from clairvoyant.policy.types import QueuedRequest, WorkerView

# Placements per worker, x max_batch, before calls wait in the global queue.  Ours: the real
# routers hold nothing back; 8x is autellix-lb's cap, so presets compared differ only in policy.
ROUTER_QUEUE_FACTOR = 8.0


def _least_loaded(candidates: Sequence[WorkerView]) -> WorkerView:
    """Fewest outstanding placements (the routers' in-flight count), then KV usage, then id."""
    return min(candidates, key=lambda w: (w.placed, w.kv_usage, w.worker_id))


def _usable(worker: WorkerView, request: QueuedRequest) -> bool:
    """The worker could take the request once it has room: same model, not draining, not excluded."""
    return (
        worker.model == request.model
        and not worker.draining
        and worker.worker_id not in request.exclude_workers
    )


class _ProgramPolicy:
    """Holds the scheduler's process table (the ProgramAware hook)."""

    def __init__(self) -> None:
        self.programs = ProcessTable()  # replaced by the scheduler's own in bind_programs

    def bind_programs(self, table: ProcessTable) -> None:
        self.programs = table


class _EngineQueued:
    def __init__(self, engine_queue_factor: float = ROUTER_QUEUE_FACTOR) -> None:
        self._factor = engine_queue_factor

    def engine_queue_factor(self) -> float:
        return self._factor


@ROUTING_POLICIES.register("session-affinity")
class SessionAffinityRouting(_EngineQueued, _ProgramPolicy):
    """Session affinity as the vLLM production-stack router's ``session`` routing logic does it
    (``vllm_router/routers/routing_logic.py``, ``SessionRouter``): every request of a session
    goes to the same worker.

    Session = (tenant, workflow_id), the process-table key.  The pin is the process table's
    ``Program.engine_id`` (the one column this policy writes), so it ends with the program.

    Readings (the real router maps a session id through a consistent-hash ring, uhashring, over
    the endpoints, and sends requests without a session id to the endpoint of lowest QPS):

    - a new session is pinned to the least loaded worker (fewest outstanding placements, then KV
      usage, then id) instead of its hash point: the same stickiness without the ring's load-blind
      placement, which depends on worker URLs that a simulation does not have;
    - a pinned worker that is gone, draining, serves another model or is excluded for the call is
      replaced by the least loaded one, which becomes the new pin (the ring moves a removed node's
      sessions to the next node; an excluded worker is our retry path);
    - a pinned worker at its admission limit makes the call wait: the router would have queued it
      on that engine;
    - a request without app_metadata goes to the least loaded worker (QPS is not in WorkerView;
      outstanding placements is the load figure both routers keep).
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.ENGINE_QUEUED})

    def __init__(self, engine_queue_factor: float = ROUTER_QUEUE_FACTOR) -> None:
        _EngineQueued.__init__(self, engine_queue_factor)
        _ProgramPolicy.__init__(self)

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        program = self.programs.get(program_key(request))
        if program is not None and program.engine_id is not None:
            pinned = next((w for w in workers if w.worker_id == program.engine_id), None)
            if pinned is not None and _usable(pinned, request):
                return pinned.worker_id if pinned.has_room else None
        best = least_used_eligible(request, workers)  # _least_loaded over the eligible, in one pass
        if best is None:
            return None
        chosen = best.worker_id
        if program is not None:
            program.engine_id = chosen
        return chosen


@dataclass(frozen=True)
class CacheAwareConfig:
    """sglang-router's cache-aware parameters; defaults are RouterArgs' (sgl-router
    ``py_src/sglang_router/router_args.py``: cache_threshold 0.3, balance_abs_threshold 64,
    balance_rel_threshold 1.5, max_tree_size 2**26).  The rule is ``src/policies/cache_aware.rs``.

    cache_threshold: route by prefix match only when the best match rate is strictly above this.
    balance_abs_threshold, balance_rel_threshold: the system is imbalanced when
      max_load - min_load > abs AND max_load > rel * min_load (load = outstanding placements).
    max_tree_tokens: per worker, the approximate tree's size bound; least recently used entries
      go first (the router bounds characters and evicts every 120 s; we bound tokens, at insert).
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_tokens: int = 2**26

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance thresholds: abs >= 0, rel >= 1")
        if self.max_tree_tokens < 1:
            raise ValueError("max_tree_tokens must be positive")


class ApproximateTrees:
    """What the router's per-worker approximate radix tree would hold, without the text.

    The scheduler's requests carry a prompt length and app_metadata, not the prompt, so an entry
    stands for a session's prefix: the longest prompt (tokens) of that session routed to the
    worker.  Reading: the prompts of one session extend one another (the conversation grows), so
    a new prompt of P tokens matches min(P, entry) tokens on a worker.  Prefixes shared across
    sessions (a common system prompt) are not seen, and two agents of one session count as one
    growing context.  A request without a session is an entry of its own that nothing matches.

        worker w1: {session A: 900, session B: 300}   size 1200
        worker w2: {session A: 400}                   size 400
        new call of A, 1000 tokens -> match rate 0.9 on w1, 0.4 on w2
    """

    def __init__(self, max_tree_tokens: int = 2**26) -> None:
        self.max_tree_tokens = max_tree_tokens
        self._entries: dict[str, OrderedDict[Hashable, int]] = {}  # worker -> entry -> tokens, LRU first
        self._size: dict[str, int] = {}
        self._holders: dict[Hashable, dict[str, int]] = {}  # entry -> worker -> tokens (newest last)

    def size(self, worker_id: str) -> int:
        return self._size.get(worker_id, 0)

    def matches(self, entry: Hashable) -> dict[str, int]:
        """Worker -> tokens held for ``entry``, the worker routed to most recently last."""
        return self._holders.get(entry, {})

    def insert(self, worker_id: str, entry: Hashable, tokens: int) -> None:
        """Route ``tokens`` of ``entry`` to ``worker_id``: a longer prompt extends the entry."""
        entries = self._entries.setdefault(worker_id, OrderedDict())
        held = entries.pop(entry, 0)
        entries[entry] = max(held, tokens)
        self._size[worker_id] = self._size.get(worker_id, 0) + max(0, tokens - held)
        holders = self._holders.setdefault(entry, {})
        holders.pop(worker_id, None)
        holders[worker_id] = entries[entry]
        while self._size[worker_id] > self.max_tree_tokens and len(entries) > 1:
            old, old_tokens = entries.popitem(last=False)
            self._size[worker_id] -= old_tokens
            self._drop_holder(old, worker_id)

    def remove_worker(self, worker_id: str) -> None:
        for entry in self._entries.pop(worker_id, {}):
            self._drop_holder(entry, worker_id)
        self._size.pop(worker_id, None)

    def workers(self) -> list[str]:
        return list(self._entries)

    def smallest(self, candidates: Sequence[WorkerView]) -> WorkerView:
        """The candidate with the smallest tree, then fewer placements, then the smaller id (one
        pass; a full key is compared only against an equally small best)."""
        sizes = self._size
        best, best_key = (
            candidates[0],
            (sizes.get(candidates[0].worker_id, 0), candidates[0].placed, candidates[0].worker_id),
        )
        for w in candidates[1:]:
            size = sizes.get(w.worker_id, 0)
            if size > best_key[0]:
                continue
            key = (size, w.placed, w.worker_id)
            if key < best_key:
                best, best_key = w, key
        return best

    def check_integrity(self) -> None:
        for worker_id, entries in self._entries.items():
            assert self._size[worker_id] == sum(entries.values()), f"{worker_id}: size drifted"
            for entry, tokens in entries.items():
                assert self._holders[entry][worker_id] == tokens
        assert sum(len(h) for h in self._holders.values()) == sum(len(e) for e in self._entries.values())

    def _drop_holder(self, entry: Hashable, worker_id: str) -> None:
        holders = self._holders.get(entry)
        if holders is not None:
            holders.pop(worker_id, None)
            if not holders:
                del self._holders[entry]


@ROUTING_POLICIES.register("sglang-cache-aware")
class CacheAwareRouting(_EngineQueued):
    """sglang-router's ``cache_aware`` policy (sgl-router ``src/policies/cache_aware.rs``):

        imbalanced (max - min > abs and max > rel x min)  -> the least loaded worker
        else best prefix match rate > cache_threshold    -> the worker with that match
        else                                             -> the worker with the smallest tree

    and in every case the request is added to the chosen worker's tree.  Load is the worker's
    outstanding placements (the router's in-flight count).  The prefix match is approximate
    (``ApproximateTrees``: the session's routed prompt lengths per worker, not the text).

    Readings: loads for the imbalance test are those of every worker that serves the model and is
    not draining (the router takes them over its worker list); candidates are the eligible ones.
    Ties go to the worker the session was routed to last (best match), then fewer placements,
    then id.  A best-match worker at its admission limit makes the call wait (the router would
    have queued it there); one that is draining or excluded does not count as a match (the
    router matches only healthy workers).  A worker that leaves takes its tree with it.

    Precise matching (``KV_AWARE``): when the workers of the model report their KV blocks, the
    match is what they hold (``KvIndexView.cached_tokens``: the prompt's leading blocks when the
    request carries its block hashes, else its session's blocks, tier-weighted) instead of the
    approximate tree, which the real router keeps only because it cannot see the engines' caches.
    Ties then go to fewer placements, then id.  The trees are still kept, for the smallest-tree
    fallback and for models whose workers report nothing (routing is then exactly as above).
    """

    capabilities = frozenset({Capability.ENGINE_QUEUED, Capability.KV_AWARE})

    def __init__(
        self, config: CacheAwareConfig | None = None, engine_queue_factor: float = ROUTER_QUEUE_FACTOR
    ) -> None:
        super().__init__(engine_queue_factor)
        self.config = config or CacheAwareConfig()
        self.trees = ApproximateTrees(self.config.max_tree_tokens)
        self._kv: KvIndexView | None = None

    def bind_kv_index(self, index: KvIndexView) -> None:
        self._kv = index

    def route(self, request: QueuedRequest, workers: Sequence[WorkerView], now: float) -> str | None:
        # One pass: the live ids, the serving workers, the candidates among them, the loads' extremes.
        model, excluded = request.model, request.exclude_workers
        live: set[str] = set()
        serving: list[WorkerView] = []
        candidates: list[WorkerView] = []
        lowest = highest = 0
        for w in workers:
            live.add(w.worker_id)
            if w.model != model or w.draining:
                continue
            load = w.placed
            if not serving:
                lowest = highest = load
            elif load < lowest:
                lowest = load
            elif load > highest:
                highest = load
            serving.append(w)
            if load < (w.admission_limit or w.max_batch) and w.worker_id not in excluded:
                candidates.append(w)
        for gone in [w for w in self.trees.workers() if w not in live]:
            self.trees.remove_worker(gone)
        if not candidates:
            return None
        cfg = self.config
        entry: Hashable = program_key(request) or ("request", request.request_id)
        if highest - lowest > cfg.balance_abs_threshold and highest > cfg.balance_rel_threshold * lowest:
            chosen = _least_loaded(candidates).worker_id
        else:
            best = self._best_match(request, entry, serving, now)
            if best is not None and best[1] > cfg.cache_threshold:
                if not best[0].has_room:  # serving, not excluded: a candidate unless full
                    return None  # the matching worker is full: wait for it
                chosen = best[0].worker_id
            else:
                chosen = self.trees.smallest(candidates).worker_id
        self.trees.insert(chosen, entry, request.prompt_tokens)
        return chosen

    def match_rate(self, request: QueuedRequest, worker_id: str) -> float:
        """Diagnostics: the approximate prefix match rate of ``request`` on a worker."""
        entry = program_key(request)
        held = self.trees.matches(entry).get(worker_id, 0) if entry is not None else 0
        return min(held, request.prompt_tokens) / request.prompt_tokens if request.prompt_tokens > 0 else 0.0

    def _best_match(
        self, request: QueuedRequest, entry: Hashable, serving: Sequence[WorkerView], now: float
    ) -> tuple[WorkerView, float] | None:
        cached = self._kv.cached_tokens(request, now) if self._kv is not None else None
        if cached is not None:
            return self._best_precise(request, cached, serving)
        if request.prompt_tokens <= 0:
            return None  # the router's match rate of an empty text is 0
        holders = self.trees.matches(entry)
        if not holders:
            return None
        by_id = {
            w.worker_id: w
            for w in serving
            if w.worker_id in holders and w.worker_id not in request.exclude_workers
        }
        best: tuple[WorkerView, float] | None = None
        # Most recently routed last, so ">=" lets the latest of equal matches win.
        for worker_id, held in holders.items():
            worker = by_id.get(worker_id)
            rate = min(held, request.prompt_tokens) / request.prompt_tokens
            if worker is not None and rate > 0 and (best is None or rate >= best[1]):
                best = (worker, rate)
        return best

    @staticmethod
    def _best_precise(
        request: QueuedRequest, cached: Mapping[str, float], serving: Sequence[WorkerView]
    ) -> tuple[WorkerView, float] | None:
        """The highest match rate of the index's cached tokens; the prompt's length is its estimate,
        or its hashed blocks' tokens when longer (the estimate counts characters)."""
        prompt = max(request.prompt_tokens, len(request.prompt_block_hashes) * BLOCK_TOKENS)
        if prompt <= 0:
            return None
        best: tuple[WorkerView, float] | None = None
        best_key: tuple[float, int, str] | None = None
        for worker in serving:
            tokens = cached.get(worker.worker_id, 0.0)
            if tokens <= 0 or worker.worker_id in request.exclude_workers:
                continue
            rate = min(tokens, prompt) / prompt
            key = (-rate, worker.placed, worker.worker_id)
            if best_key is None or key < best_key:
                best, best_key = (worker, rate), key
        return best


@PRIORITY_POLICIES.register("program-fcfs")
class ProgramFcfsPriority(_ProgramPolicy):
    """Continuum's program-level FCFS: a call ranks by its program's first arrival, so the later
    turns of an agent run before programs that arrived after it (Continuum, "Efficient and Robust
    Multi-Turn LLM Agent Scheduling with KV Cache Time-to-Live": requests are ordered by the
    arrival of the job they belong to).  Priority = -(first arrival of the program); a call of no
    program ranks by its own arrival.  Ties: arrival, then submission (the scheduler's order).

    The first arrival is the process table's ``Program.first_arrival``: the earliest arrival of a
    call submitted to the program's entry, which outlives its calls' completions and goes with the
    entry (a program that ended or idled out and comes back starts afresh).  A call whose entry
    is gone while it waits (``end_workflow``) ranks by its own arrival.  The value reads only the
    call and its program's entry, so only the programs an update touched are re-ranked
    (``IncrementalPriority``).
    """

    capabilities = frozenset({Capability.PROGRAM_AWARE, Capability.INCREMENTAL_PRIORITY})

    def __init__(self) -> None:
        super().__init__()
        self._rows = ProgramRows()

    def priority(self, request: QueuedRequest, now: float) -> float:
        program = self.programs.get(program_key(request))
        return -request.arrival_time if program is None else -min(program.first_arrival, request.arrival_time)

    def priority_changes(self, now: float) -> PriorityChanges:
        return self._rows.changes(self.programs)


PRESETS.register_preset("vllm-prodstack", Preset("fcfs", "session-affinity", cache="lmcache"))
PRESETS.register_preset("sglang-gw", Preset("fcfs", "sglang-cache-aware", cache="hicache"))
PRESETS.register_preset("continuum", Preset("program-fcfs", "session-affinity", cache="continuum"))
