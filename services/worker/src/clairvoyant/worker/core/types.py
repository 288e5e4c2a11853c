"""Plain data crossing the engine boundary: requests in, outputs and stats out, and the errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import xgrammar as xgr

from clairvoyant.worker.core.sampling import SamplingParams, TokenLogprob

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Lineage:
    """Who a request belongs to; tags the prefix-cache blocks it creates.

    ``tenant`` is also the prefix-cache isolation boundary: a request only ever reuses blocks created by
    requests of the same tenant (requests without a lineage share only among themselves).
    """

    tenant: str
    workflow_id: str | None = None
    agent_id: str | None = None
    request_id: str | None = None


@dataclass
class EngineRequest:
    """One generation request as the engine receives it (already tokenized)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    priority: float = 0.0  # set by the global scheduler; LARGER = more urgent
    lineage: Lineage | None = None
    arrival_time: float | None = None  # engine clock time; None = "now" at add_request
    detokenize: bool = True  # False: outputs carry token ids only, no text (the simulator); no stop strings
    scheduler_preset: str = ""  # the preset that placed it; the engine ranks with its rule ("" keeps the rule)
    # Its program's completed calls' waiting and service time at the placement (engine rules read them)
    program_wait_s: float = 0.0
    program_service_s: float = 0.0
    # sampling.constraint compiled (core/grammar.py); None: the engine compiles it when added
    grammar: xgr.CompiledGrammar | None = None
    # The scheduler's admission limit for this engine at the placement (its knee): the engine runs
    # at most this many sequences, preempting the least urgent for a more urgent one; 0: no limit
    # beyond max_num_seqs.  The latest placement's value holds for the whole engine.
    seat_limit: int = 0


@dataclass
class RequestOutput:
    """What one step produced for one request (incremental: only what is new since the last output)."""

    request_id: str
    new_token_ids: list[int]  # tokens sampled this step (includes a final EOS token, which has no text)
    new_text: str  # text of new tokens, minus anything held back (partial UTF-8 char, possible stop prefix)
    finished: bool
    finish_reason: FinishReason | None  # "stop" (EOS or stop string), "length" (max_tokens), "abort"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache when the request was first admitted
    completion_tokens: int  # tokens generated so far, in total
    first_token_time: float | None  # engine clock time of the first sampled token
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, when the request asked for them
    stop_sequence: str | None = None  # the final output's, when a stop string ended the request
    index: int = 0  # the choice (SamplingParams.n > 1); ``finished`` is this choice's


class DecodeSpeed(NamedTuple):
    """A decode step's cost: ``base_s + per_seq_s × batch`` seconds (``core/decode_speed.py``)."""

    base_s: float  # seconds of a decode step before any sequence's share (weights, overhead)
    per_seq_s: float  # seconds each sequence adds to a decode step, at the current context


@dataclass
class EngineStats:
    """A snapshot of the engine's counters (``*_total`` are monotonic since start-up)."""

    running: int  # sequences holding KV blocks (decoding or mid-prefill)
    waiting: int  # queued sequences holding no blocks (new or preempted)
    kv_blocks_used: int  # blocks not on the free list (includes those held only by the prefix cache)
    kv_blocks_total: int
    kv_blocks_cached: int  # blocks held only by the prefix cache (evictable on demand)
    preemptions_total: int
    prompt_tokens_total: int  # prompt tokens of all added requests
    computed_prompt_tokens_total: int  # prompt positions run through the model (recomputes count again)
    cached_prompt_tokens_total: int  # prompt tokens served from the prefix cache (each request's first admission)
    generated_tokens_total: int
    max_num_seqs: int
    decode_speed: DecodeSpeed | None = None  # None: not known yet (or the engine does not say)
    # KV tiers (core/tiers.py); zeros without them
    l2_blocks_used: int = 0
    l2_blocks_total: int = 0
    hit_tokens: tuple[int, int, int] = (0, 0, 0)  # of those, served from L1, L2, L3
    l3_backend: str = ""  # the L3 store's name; "" without one
    demoted_blocks_total: int = 0
    promoted_blocks_total: int = 0
    l3_written_blocks_total: int = 0
    l3_fetched_blocks_total: int = 0
    l3_errors_total: int = 0


Tier = Literal[1, 2, 3]  # L1 device, L2 host, L3 shared storage
KvEventKind = Literal["stored", "removed", "cleared"]


@dataclass(frozen=True)
class KvEvent:
    """A change to what one tier of this engine holds, as vLLM's and llm-d's KV events report it.

    ``stored``: consecutive blocks, each the parent of the next, the first below ``parent_hash``
    (None: at the namespace root), all computed by ``tag``'s lineage.  ``removed``: blocks gone
    from the tier (in no particular order).  ``cleared``: the tier lost everything (the hashes are
    empty).  Hashes are the chained block hashes of ``clairvoyant.core.blockhash`` over the
    engine's block size; ``namespace`` is the tenant (None: requests without one).
    """

    kind: KvEventKind
    tier: Tier
    namespace: str | None
    block_hashes: tuple[int, ...]
    parent_hash: int | None = None
    tag: object | None = None  # the stored blocks' ``BlockTag`` (lineage and prompt/response)
