"""Token ids for a workflow's prompts, built from their composition so that prefix reuse is real.

System prompts are a fixed pseudo-random sequence per (workflow type, agent); a segment that
reuses an earlier call's prompt or response copies that call's actual token ids (the response is
what the engine generated); fresh tokens are drawn from a generator seeded by the call id.  The
radix cache then hits exactly where the workload says a prefix is shared.
"""

from __future__ import annotations

import zlib

import numpy as np

from clairvoyant.workloads.program import Call

VOCAB = 256  # byte-level ids: every runner's tokenizer accepts them


def _stream(key: str, seed: int, length: int) -> list[int]:
    rng = np.random.default_rng([zlib.crc32(key.encode()), seed])
    return rng.integers(0, VOCAB, size=length).tolist()


class PromptBook:
    """Remembers every call's prompt and response ids for later segments to copy."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._system: dict[tuple[str, str], list[int]] = {}
        self._prompts: dict[str, list[int]] = {}
        self._responses: dict[str, list[int]] = {}

    def prompt(self, workflow_type: str, call: Call) -> list[int]:
        ids: list[int] = []
        for segment in call.prompt:
            if segment.kind == "system":
                ids += self._system_prompt(workflow_type, segment.agent_id, segment.tokens)
            elif segment.kind == "call":
                source = self._prompts if segment.part == "prompt" else self._responses
                reused = source.get(segment.call_id, [])[: segment.tokens]
                pad = segment.tokens - len(reused)
                key = f"{call.call_id}/pad{len(ids)}"  # where the segment starts, as before ``reused``
                ids += reused
                if pad > 0:  # a response cut short (e.g. a preempted run) is topped up with fresh tokens
                    ids += _stream(key, self.seed, pad)
            else:
                ids += _stream(f"{call.call_id}/new{len(ids)}", self.seed, segment.tokens)
        self._prompts[call.call_id] = ids
        return ids

    def prompt_of(self, call_id: str) -> list[int]:
        """The ids ``prompt`` built for ``call_id`` ([] once forgotten, or never built)."""
        return self._prompts.get(call_id, [])

    def record_response(self, call_id: str, token_ids: list[int]) -> None:
        self._responses[call_id] = token_ids

    def forget(self, call_ids: list[str]) -> None:
        """Drop a finished workflow's ids (memory stays bounded on long runs)."""
        for call_id in call_ids:
            self._prompts.pop(call_id, None)
            self._responses.pop(call_id, None)

    def _system_prompt(self, workflow_type: str, agent_id: str, tokens: int) -> list[int]:
        key = (workflow_type, agent_id)
        known = self._system.get(key, [])
        if len(known) < tokens:
            known = _stream(f"system/{workflow_type}/{agent_id}", self.seed, max(tokens, 2 * len(known)))
            self._system[key] = known
        return known[:tokens]
