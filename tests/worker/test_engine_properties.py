"""Random add / abort / step sequences against a tiny pool: accounting always holds, tokens are exact.

The fake runner's logits depend only on a sequence's context and sampling is seeded per request, so
whatever the interleaving, preemptions, cache hits and chunking, every request must produce exactly
the tokens it produces alone in a roomy engine (aborted ones: a prefix of them).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from clairvoyant.worker.core.engine import EngineRequest, Lineage
from tests.worker.fakes import Clock, Collected, collect, drain, letters, make_engine, request

pytestmark = pytest.mark.unit

BLOCK_SIZE, NUM_BLOCKS = 4, 16
PREFIXES = [letters(8, seed=1000), letters(13, seed=1001)]


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.engine, _ = make_engine(
            clock=self.clock,
            block_size=BLOCK_SIZE,
            num_blocks=NUM_BLOCKS,
            max_num_seqs=3,
            max_num_batched_tokens=10,
            aging_rate=0.05,
        )
        self.accepted: dict[str, EngineRequest] = {}
        self.aborted: set[str] = set()
        self.results: dict[str, Collected] = {}
        self.count = 0

    @rule(
        prefix=st.sampled_from([None, 0, 1]),
        suffix_len=st.integers(0, 20),
        max_tokens=st.integers(1, 14),
        priority=st.sampled_from([0.0, 1.0, 5.0]),
        temperature=st.sampled_from([0.0, 0.8]),
        tenant=st.sampled_from([None, "t1", "t2"]),
    )
    def add(
        self,
        prefix: int | None,
        suffix_len: int,
        max_tokens: int,
        priority: float,
        temperature: float,
        tenant: str | None,
    ) -> None:
        rid = f"r{self.count}"
        self.count += 1
        prompt = (PREFIXES[prefix] if prefix is not None else []) + letters(suffix_len, seed=self.count)
        lineage = Lineage(tenant, request_id=rid) if tenant else None
        req = request(
            rid, prompt, max_tokens=max_tokens, temperature=temperature, priority=priority, lineage=lineage
        )
        blocks = -(-(len(prompt) + max_tokens - 1) // BLOCK_SIZE)
        if not prompt or blocks > NUM_BLOCKS:
            with pytest.raises(ValueError):
                self.engine.add_request(req)
            return
        self.engine.add_request(req)
        self.accepted[rid] = req

    @precondition(lambda self: bool(self.accepted))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.accepted) + ["unknown"]))
        finished = rid in self.results and self.results[rid].outputs[-1].finished
        live = rid in self.accepted and rid not in self.aborted and not finished
        assert self.engine.abort_request(rid) is live
        if live:
            self.aborted.add(rid)

    @rule(steps=st.integers(1, 4))
    def step(self, steps: int) -> None:
        for _ in range(steps):
            collect(self.engine.step(), self.results)
            self.clock.now += 0.5

    @invariant()
    def accounting_holds(self) -> None:
        self.engine.check_integrity()
        stats = self.engine.stats()
        assert stats.running <= 3 and stats.kv_blocks_cached <= stats.kv_blocks_used <= NUM_BLOCKS

    def teardown(self) -> None:
        drain(self.engine, self.results)
        stats = self.engine.stats()
        assert stats.running == stats.waiting == 0
        assert stats.kv_blocks_used == stats.kv_blocks_cached
        assert set(self.results) >= set(self.aborted)
        assert stats.generated_tokens_total == sum(len(c.token_ids) for c in self.results.values())

        reference, _ = make_engine(block_size=BLOCK_SIZE, num_blocks=512)
        for req in self.accepted.values():
            reference.add_request(req)
        expected = drain(reference)
        for rid, req in self.accepted.items():
            got = self.results[rid]
            if rid in self.aborted:
                assert got.final.finish_reason == "abort"
                assert got.token_ids == expected[rid].token_ids[: len(got.token_ids)]
            else:
                assert got.token_ids == expected[rid].token_ids, rid
                assert got.text == expected[rid].text
                assert got.final.finish_reason == "length" == expected[rid].final.finish_reason
                assert len(got.token_ids) == req.sampling.max_tokens


EngineMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_engine_state_machine = EngineMachine.TestCase
