"""The cache family: what the cache manager directs the workers to do with their KV blocks.

A cache policy sees what the cluster does and answers with directives:

    completed call ──> on_completion(call, view, now) ──> [CacheDirective, ...]
    a clock tick   ──> on_tick(view, now)              ──> [CacheDirective, ...]
    a cached block ──> eviction_rank(block, now)       ──> its place in the eviction order

``view`` (``CacheView``) is the cache manager's read-only state: which worker holds which blocks in
which tier (its index, built from the workers' KV events), each worker's load, and the
tenant-scoped workflow history from which a predicted next prompt is assembled.  Directives are
the worker's vocabulary (``worker/core/tiers.py``): drop, retain (pin against eviction for a TTL),
write back to L3, promote (L3 -> L2, or -> L1), pre-prefill.  A policy never does I/O and never
reads a clock: the live service and the simulator run the same object.

The engines evict least recently used first; a policy changes that order only through its
directives (drop early, retain).  ``eviction_rank`` states the order the policy wants, so the
offline replay (``bench cache-replay``) can score it against Belady's optimum at equal capacity.

``lru`` is every engine's behaviour: no directives, least recently used first; the radix cache
implements that order natively (``worker/core/radix_cache.py``), and a test checks they agree.
The other policies live one per module: ``cache_pythia.py``, ``cache_kvflow.py``, ``cache_saga.py``,
``cache_continuum.py`` and ``cache_baselines.py`` (lmcache, hicache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

from clairvoyant.core.annotations import SysAnnotations
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.policy.capabilities import PolicyRegistry

DirectiveKind = Literal["drop", "retain", "write_back", "promote", "pre_prefill"]
Tier = Literal[1, 2, 3]  # 1: device memory, 2: host memory, 3: shared storage


class BlockUse(NamedTuple):
    """What a cache policy may know of one cached block (the replay's and the index's unit)."""

    block_hash: int
    last_access: float  # when a sequence last matched or wrote it
    hits: int = 0  # prefix matches since it was cached
    tenant: str = ""
    workflow_id: str = ""
    agent_id: str = ""  # the lineage that computed it ("" unknown)
    request_id: str = ""
    tokens: int = (
        0  # size of the entry the block belongs to (its request's prompt + response), for size-aware policies
    )
    response: bool = False  # the block holds response tokens


@dataclass(frozen=True, slots=True)
class CacheDirective:
    """One directive for one worker (``worker_id``), in the worker's vocabulary.

    Blocks are chosen by ``block_hashes`` when given, else by the lineage fields that are set
    (none set: every block of ``tenant``).  ``target_tier``: None for every tier (drop) or the
    natural one (retain: L1, promote: L1).  ``token_ids``: the prompt to pre-prefill, or to
    promote from L3 by its hash chain.  ``speculative``: acts on a prediction (promote,
    pre-prefill), so its tokens count as wasted if no request then uses them.  ``reason`` is for
    diagnostics (the Plan RPC and the logs)."""

    kind: DirectiveKind
    worker_id: str
    tenant: str
    workflow_id: str = ""
    agent_id: str = ""
    request_id: str = ""
    block_hashes: tuple[int, ...] = ()
    ttl_s: float | None = None
    target_tier: Tier | None = None
    token_ids: tuple[int, ...] = ()
    speculative: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CompletedCall:
    """One finished request, from its completion record (``cv.requests.completed``)."""

    request_id: str
    tenant: str
    model: str
    worker_id: str
    start: float  # arrival, on the cache manager's clock
    end: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ok: bool = True  # served to the end (not cancelled, not failed)
    app_metadata: AppMetadata | None = None  # None: the application sent no workflow ids
    annotations: SysAnnotations | None = None  # what the profiler predicted for it
    prompt_block_hashes: tuple[int, ...] = ()  # chained 16-token block hashes (core.blockhash)
    response_block_hashes: tuple[int, ...] = ()  # the chain continued over the response
    prompt_token_ids: tuple[int, ...] = ()  # for the workflow history (empty: not recorded)
    output_token_ids: tuple[int, ...] = ()


class WorkerLoad(NamedTuple):
    """A worker as the cache manager last heard of it."""

    worker_id: str
    model: str
    running: int = 0
    queued: int = 0
    max_batch: int = 0
    l1_used: int = 0  # blocks
    l1_total: int = 0
    l2_used: int = 0
    l2_total: int = 0  # 0: no host tier
    has_l3: bool = False
    hit_tokens: tuple[int, int, int] = (
        0,
        0,
        0,
    )  # prompt tokens served from L1, L2, L3 since the worker started

    @property
    def idle(self) -> bool:
        """Nothing running or queued: its GPU has cycles for a background pre-prefill (Alg. 1 l.18)."""
        return self.running == 0 and self.queued == 0

    def pressure(self, tier: Tier) -> float:
        """Used / total of ``tier`` (0 when it has none)."""
        used, total = (self.l1_used, self.l1_total) if tier == 1 else (self.l2_used, self.l2_total)
        return used / total if total else 0.0


class Residency(NamedTuple):
    """How much of a prompt's block chain a worker holds: the leading run, per tier."""

    worker_id: str
    l1_blocks: int  # leading blocks in device memory
    l2_blocks: int  # leading blocks in device or host memory
    l3_blocks: (
        int  # leading blocks anywhere, shared storage included (L3 counts for every worker of the model)
    )


class CacheView(Protocol):
    """The cache manager's state, read-only, as a policy sees it.  Everything is tenant-scoped: a
    query names its tenant and never sees another's blocks or history."""

    def workers(self, model: str) -> Sequence[WorkerLoad]:
        """The live workers serving ``model`` ("" for every model), in a stable order."""
        ...

    def residency(self, tenant: str, model: str, block_hashes: Sequence[int]) -> Sequence[Residency]:
        """For each live worker of ``model``: the leading run of ``block_hashes`` it holds, per tier."""
        ...

    def blocks(self, tenant: str, workflow_id: str) -> Sequence[tuple[str, Tier, BlockUse]]:
        """(worker, tier, block) for every block the index holds that ``workflow_id``'s lineage
        computed, oldest first."""
        ...

    def references(self, tenant: str, block_hash: int) -> int:
        """How many live workflows of ``tenant`` other than the block's own have it in a prompt or
        response chain (a shared system prompt has many; a dead block none)."""
        ...

    def assemble(
        self, tenant: str, workflow_id: str, template: str, agent_id: str = ""
    ) -> tuple[int, ...] | None:
        """The token ids of ``template`` (a profiler prompt-composition template) filled from the
        workflow's history, up to its ``${new}``; None when the history lacks a source it names.
        ``agent_id``: the agent whose prompt the template is (its ``${static:...}`` source; without
        it a static source is missing)."""
        ...

    def history_agents(self, tenant: str, workflow_id: str) -> Sequence[str]:
        """The agents of the workflow's finished calls, in order."""
        ...

    def chains(self, tenant: str, workflow_id: str, agent_id: str) -> Sequence[tuple[int, ...]]:
        """The block chains (prompt then response hashes) of ``agent_id``'s finished calls in the
        workflow, most recent first: what a template naming that agent copies a prefix of."""
        ...


class CachePolicy(Protocol):
    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        """Directives on ``call``'s completion (its record has just been read)."""
        ...

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        """Directives due at ``now`` (expired TTLs, memory pressure); called every tick interval."""
        ...

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        """The block's rank at ``now``: among evictable blocks the lowest goes first.  Must be
        cheap and deterministic; ties go to the block cached first."""
        ...

    def forget(self, tenant: str, workflow_id: str) -> None:
        """The workflow ended or expired: drop any state kept for it."""
        ...


CACHE_POLICIES: PolicyRegistry[CachePolicy] = PolicyRegistry("cache policy")


@CACHE_POLICIES.register("lru")
class LruCache:
    """Least recently used first; no directives (every engine's behaviour)."""

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        return []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        return None


def tool_of(call: CompletedCall) -> str:
    """The tool that preceded ``call`` ("" for none)."""
    return (call.app_metadata.tool or "") if call.app_metadata is not None else ""


def lineage_key(call: CompletedCall) -> tuple[str, str] | None:
    """(tenant, workflow_id) of a workflow call; None for a call without workflow ids."""
    meta = call.app_metadata
    if meta is None or not meta.workflow_id:
        return None
    return call.tenant, meta.workflow_id


__all__ = [
    "CACHE_POLICIES",
    "BlockUse",
    "CacheDirective",
    "CachePolicy",
    "CacheView",
    "CompletedCall",
    "DirectiveKind",
    "LruCache",
    "Residency",
    "Tier",
    "WorkerLoad",
    "lineage_key",
    "tool_of",
]
