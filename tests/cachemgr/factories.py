"""Small real objects for the cache manager's core tests: KV batches, completed calls, a policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import sequence_hashes
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy.cache import BlockUse, CacheDirective, CacheView, CompletedCall

STORED, REMOVED, CLEARED = KvEventKind.STORED, KvEventKind.REMOVED, KvEventKind.CLEARED


def stored(
    hashes: list[int],
    tier: KvTier = KvTier.L1,
    tenant: str = "t",
    workflow_id: str = "",
    agent_id: str = "",
    request_id: str = "",
    response: bool = False,
) -> KvBlockEvent:
    return KvBlockEvent(
        STORED,
        tier,
        tenant,
        tuple(hashes),
        workflow_id=workflow_id,
        agent_id=agent_id,
        request_id=request_id,
        response=response,
    )


def removed(hashes: list[int], tier: KvTier = KvTier.L1, tenant: str = "t") -> KvBlockEvent:
    return KvBlockEvent(REMOVED, tier, tenant, tuple(hashes))


def cleared(tier: KvTier = KvTier.L1) -> KvBlockEvent:
    return KvBlockEvent(CLEARED, tier)


def batch(worker: str, sequence: int, *events: KvBlockEvent, model: str = "m") -> KvBatch:
    return KvBatch(worker, model, 16, sequence, tuple(events))


def call(
    request_id: str,
    prompt: list[int],
    output: list[int],
    *,
    tenant: str = "t",
    workflow_id: str = "w1",
    agent_id: str = "a",
    workflow_type_id: str = "type",
    start: float = 0.0,
    end: float | None = None,
    workflow_end: bool | None = None,
    worker_id: str = "w",
    cached_tokens: int = 0,
    with_tokens: bool = True,
) -> CompletedCall:
    """A completed call with its chains computed from its tokens (``workflow_id`` "": no workflow)."""
    prompt_blocks, response_blocks = sequence_hashes(prompt, output)
    meta = (
        AppMetadata(workflow_type_id, workflow_id, agent_id, workflow_end=workflow_end)
        if workflow_id
        else None
    )
    return CompletedCall(
        request_id=request_id,
        tenant=tenant,
        model="m",
        worker_id=worker_id,
        start=start,
        end=start + 1.0 if end is None else end,
        prompt_tokens=len(prompt),
        output_tokens=len(output),
        cached_tokens=cached_tokens,
        app_metadata=meta,
        prompt_block_hashes=tuple(prompt_blocks),
        response_block_hashes=tuple(response_blocks),
        prompt_token_ids=tuple(prompt) if with_tokens else (),
        output_token_ids=tuple(output) if with_tokens else (),
    )


@dataclass
class RecordingPolicy:
    """Answers with scripted directives and records what it was asked and what the view showed."""

    on_completion_answers: list[list[CacheDirective]] = field(default_factory=list)
    on_tick_answers: list[list[CacheDirective]] = field(default_factory=list)
    completions: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (request, agents seen)
    ticks: list[float] = field(default_factory=list)
    forgotten: list[tuple[str, str]] = field(default_factory=list)

    def on_completion(self, call: CompletedCall, view: CacheView, now: float) -> list[CacheDirective]:
        meta = call.app_metadata
        agents = tuple(view.history_agents(call.tenant, meta.workflow_id)) if meta is not None else ()
        self.completions.append((call.request_id, agents))
        return self.on_completion_answers.pop(0) if self.on_completion_answers else []

    def on_tick(self, view: CacheView, now: float) -> list[CacheDirective]:
        self.ticks.append(now)
        return self.on_tick_answers.pop(0) if self.on_tick_answers else []

    def eviction_rank(self, block: BlockUse, now: float) -> float:
        return block.last_access

    def forget(self, tenant: str, workflow_id: str) -> None:
        self.forgotten.append((tenant, workflow_id))
