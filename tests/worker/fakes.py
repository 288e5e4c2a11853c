"""Engine-test fakes: a byte tokenizer and a deterministic runner that really uses the paged store.

``FakeRunner`` keeps one "K/V" value per slot: the value at position p is a hash of the value at p-1
(read back through the block table) and the token at p, so it encodes the whole prefix.  Logits for a
sequence come from a hash of every value at positions 0..end-1, read back through the block table.
A wrong block table, a shared block that holds another prefix, or a shared block overwritten by
another sequence therefore changes the tokens, and comparing against a reference run catches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from clairvoyant.worker.core.engine import EngineConfig, EngineRequest, LLMEngine, RequestOutput
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.runners.base import ForwardItem, ModelInfo

EOS = 256
ALPHABET = tuple(b"abcdefghijklmnopqrstuvwxyz ")
_MASK = (1 << 63) - 1


class ByteTokenizer:
    """Token id = byte value; 256 is EOS (skipped when decoding)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if t < 256).decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,  # not rendered
    ) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return self.encode(text + ("<assistant>" if add_generation_prompt else ""))


class FakeRunner:
    def __init__(self, max_model_len: int = 4096, eos_bias: float = float("-inf")) -> None:
        self.info = ModelInfo(
            name="fake",
            vocab_size=257,
            max_model_len=max_model_len,
            eos_token_ids=(EOS,),
            num_layers=1,
            num_kv_heads=1,
            head_dim=1,
        )
        self.tokenizer = ByteTokenizer()
        self.eos_bias = eos_bias
        self.block_size = 0
        self.slots: list[int | None] = []
        self.calls: list[list[tuple[int, int, int, bool]]] = []  # per step: (seq_id, n, start, logits)

    def kv_bytes_per_token(self) -> int:
        return 8

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        assert not self.slots, "allocate_kv called twice"
        self.block_size = block_size
        self.slots = [None] * (num_blocks * block_size)

    def _slot(self, block_table: Sequence[int], pos: int) -> int:
        return block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    def forward(self, items: Sequence[ForwardItem]) -> torch.Tensor:
        self.calls.append([(it.seq_id, len(it.token_ids), it.start_pos, it.want_logits) for it in items])
        rows = []
        for it in items:
            end = it.start_pos + len(it.token_ids)
            assert len(it.block_table) * self.block_size >= end, "block table too short"
            prev = 0 if it.start_pos == 0 else self.slots[self._slot(it.block_table, it.start_pos - 1)]
            assert prev is not None, "reading a slot that was never written"
            for i, token in enumerate(it.token_ids):
                prev = (prev * 1_000_003 + token * 0x9E3779B97F4A7C15 + 1) & _MASK
                self.slots[self._slot(it.block_table, it.start_pos + i)] = prev
            if it.want_logits:
                context = tuple(self.slots[self._slot(it.block_table, p)] for p in range(end))
                assert None not in context
                rows.append(self._logits(hash(context) & _MASK))
        if not rows:
            return torch.empty(0, self.info.vocab_size)
        return torch.stack(rows)

    def _logits(self, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        values = torch.randn(self.info.vocab_size, generator=gen)
        logits = torch.full((self.info.vocab_size,), -1e9)
        allowed = list(ALPHABET)
        logits[allowed] = values[allowed]
        logits[EOS] = values[EOS] + self.eos_bias if self.eos_bias != float("-inf") else -1e9
        return logits


class Collected:
    """Everything the engine emitted for one request."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.text = ""
        self.outputs: list[RequestOutput] = []

    @property
    def final(self) -> RequestOutput:
        assert self.outputs and self.outputs[-1].finished
        return self.outputs[-1]


def drain(
    engine: LLMEngine,
    results: dict[str, Collected] | None = None,
    max_steps: int = 10_000,
    check: bool = True,
) -> dict[str, Collected]:
    """Step until nothing is unfinished; collect outputs per request id."""
    results = {} if results is None else results
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return results
        collect(engine.step(), results)
        if check:
            engine.check_integrity()
    raise AssertionError("engine did not finish")


def collect(outputs: list[RequestOutput], results: dict[str, Collected]) -> None:
    for out in outputs:
        c = results.setdefault(out.request_id, Collected())
        assert not c.outputs or not c.outputs[-1].finished, f"{out.request_id} output after finish"
        c.token_ids += out.new_token_ids
        c.text += out.new_text
        c.outputs.append(out)
        assert out.completion_tokens == len(c.token_ids)


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def letters(n: int, seed: int) -> list[int]:
    """A deterministic prompt of n alphabet tokens."""
    gen = torch.Generator().manual_seed(seed)
    return [ALPHABET[int(i)] for i in torch.randint(0, len(ALPHABET), (n,), generator=gen)]


def request(
    rid: str, prompt: list[int], max_tokens: int = 8, temperature: float = 0.0, **kw: Any
) -> EngineRequest:
    sampling_keys = {
        "top_p", "seed", "stop", "ignore_eos", "min_tokens",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "logprobs",
    }  # fmt: skip
    sampling = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, **{k: v for k, v in kw.items() if k in sampling_keys}
    )
    return EngineRequest(rid, prompt, sampling, **{k: v for k, v in kw.items() if k not in sampling_keys})


def make_engine(
    runner: FakeRunner | None = None, clock: Clock | None = None, **config: Any
) -> tuple[LLMEngine, FakeRunner]:
    runner = runner or FakeRunner()
    return LLMEngine(runner, EngineConfig(**config), clock or Clock()), runner
