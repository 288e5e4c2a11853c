"""An in-memory ``CacheView`` for the cache policy tests: the index, loads, references and
assembled prompts are set directly by the test."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from clairvoyant.policy.cache import BlockUse, Residency, Tier, WorkerLoad


@dataclass
class FakeView:
    loads: list[WorkerLoad] = field(default_factory=list)
    index: list[tuple[str, Tier, BlockUse]] = field(
        default_factory=list
    )  # (worker, tier, block), oldest first
    refs: dict[tuple[str, int], int] = field(default_factory=dict)
    prompts: dict[tuple[str, str, str], tuple[int, ...]] = field(
        default_factory=dict
    )  # (tenant, wf, template)
    agents: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    calls: dict[tuple[str, str, str], list[tuple[int, ...]]] = field(default_factory=dict)  # most recent first

    def hold(self, worker_id: str, tier: Tier, *blocks: BlockUse) -> None:
        self.index.extend((worker_id, tier, block) for block in blocks)

    def workers(self, model: str) -> Sequence[WorkerLoad]:
        return sorted((w for w in self.loads if not model or w.model == model), key=lambda w: w.worker_id)

    def residency(self, tenant: str, model: str, block_hashes: Sequence[int]) -> Sequence[Residency]:
        shared = {b.block_hash for _, tier, b in self.index if tier == 3 and b.tenant == tenant}
        rows = []
        for worker in self.workers(model):
            held = {
                t: {
                    b.block_hash
                    for w, tier, b in self.index
                    if w == worker.worker_id and tier == t and b.tenant == tenant
                }
                for t in (1, 2)
            }
            runs = []
            for have in (held[1], held[1] | held[2], held[1] | held[2] | shared):
                run = 0
                while run < len(block_hashes) and block_hashes[run] in have:
                    run += 1
                runs.append(run)
            rows.append(Residency(worker.worker_id, runs[0], runs[1], runs[2]))
        return rows

    def blocks(self, tenant: str, workflow_id: str) -> Sequence[tuple[str, Tier, BlockUse]]:
        return [(w, t, b) for w, t, b in self.index if b.tenant == tenant and b.workflow_id == workflow_id]

    def references(self, tenant: str, block_hash: int) -> int:
        return self.refs.get((tenant, block_hash), 0)

    def assemble(
        self, tenant: str, workflow_id: str, template: str, agent_id: str = ""
    ) -> tuple[int, ...] | None:
        return self.prompts.get((tenant, workflow_id, template))

    def history_agents(self, tenant: str, workflow_id: str) -> Sequence[str]:
        return self.agents.get((tenant, workflow_id), [])

    def chains(self, tenant: str, workflow_id: str, agent_id: str) -> Sequence[tuple[int, ...]]:
        return self.calls.get((tenant, workflow_id, agent_id), [])
