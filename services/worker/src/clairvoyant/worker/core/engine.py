"""LLMEngine: a synchronous, step-based engine.  ``step()`` = schedule -> ``runner.forward`` -> post-process.

With ``EngineConfig.tiers`` giving an L2 host pool (and optionally an L3 store), the engine keeps
KV in tiers (``core/tiers.py``): each step starts by applying finished transfers, admission loads
L2 hits into L1, evicted blocks go down to L2, and cached blocks go out to L3 as the write policy
says.  ``apply_directive`` takes the cache manager's directives, and ``drain_kv_events`` hands
out what changed in each tier (when built with ``kv_events``).

Not thread-safe: ``add_request``, ``abort_request``, ``step``, ``stats`` and ``check_integrity`` must
all be called from one thread (the adapter's engine loop).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import xgrammar as xgr

from clairvoyant.core.context_window import check_context_window
from clairvoyant.worker.core.block_manager import BlockManager
from clairvoyant.worker.core.decode_run import (
    Allocations,
    DecodeRun,
    decode_horizon,
    replay_block_events,
)
from clairvoyant.worker.core.decode_speed import MeasuredSpeed, ModelledSpeed
from clairvoyant.worker.core.detokenize import IncrementalDetokenizer, NoText
from clairvoyant.worker.core.grammar import GrammarCache, TokenMasks, allows_only
from clairvoyant.worker.core.l3 import L3Store
from clairvoyant.worker.core.sampling import (
    SampleRow,
    SamplingParams,
    TokenLogprob,
    make_generator,
    sample,
    token_logprobs,
)
from clairvoyant.worker.core.scheduler import Scheduler, SchedulerOutput
from clairvoyant.worker.core.sequence import Sequence, SequenceStatus
from clairvoyant.worker.core.tiers import Directive, DirectiveError, Executor, KvTiers, TierConfig
from clairvoyant.worker.core.types import (
    DecodeSpeed,
    EngineRequest,
    EngineStats,
    FinishReason,
    KvEvent,
    Lineage,
    RequestOutput,
)
from clairvoyant.worker.runners.base import FastForwardRunner, ForwardItem, ModelRunner

__all__ = [
    "DecodeRun",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "LLMEngine",
    "Lineage",
    "RequestOutput",
    "SamplingParams",
]


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    num_blocks: int = 1024  # KV blocks in the device pool (L1)
    max_num_seqs: int = 32  # max running sequences (batch size)
    max_num_batched_tokens: int = 2048  # token budget per step (chunked prefill splits long prompts)
    enable_prefix_cache: bool = True
    aging_rate: float = 0.0  # effective priority = base priority + aging_rate * seconds waited
    seed: int = 0  # seeds requests without their own seed (with the request id)
    tiers: TierConfig = field(default_factory=TierConfig)  # L2 and L3 (none by default)

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        if self.aging_rate < 0:
            raise ValueError("EngineConfig.aging_rate must be >= 0")


def _in_vocabulary(token_ids: list[int], vocab_size: int) -> bool:
    """Whether every id is in ``[0, vocab_size)``.  Ids that all fit a byte (byte-level prompts,
    every vocabulary has 256 ids or more) pass with one ``bytes()`` conversion, which checks the
    range in C, instead of a ``min`` and a ``max`` pass."""
    if vocab_size >= 256:
        try:
            bytes(token_ids)
            return True
        except (ValueError, TypeError):
            pass
    return min(token_ids) >= 0 and max(token_ids) < vocab_size


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig,
        clock: Callable[[], float] = time.monotonic,
        *,
        l3: L3Store | None = None,
        executor: Executor | None = None,
        kv_events: bool = False,
        grammars: GrammarCache | None = None,
    ) -> None:
        """``l3``: the shared store (needs an L2, ``config.tiers.num_host_blocks``); ``executor``
        runs L3 calls (default: inline, for the simulator and tests; the worker passes a thread);
        ``kv_events``: record ``KvEvent``s for ``drain_kv_events``; ``grammars``: compiles the
        constraints of requests added without their grammar (default: a cache of its own)."""
        self.runner = runner
        self.config = config
        self.clock = clock
        self.kv_events: list[KvEvent] | None = [] if kv_events else None
        self.kv = BlockManager(
            config.num_blocks, config.block_size, config.enable_prefix_cache,
            hashing=kv_events or l3 is not None, events=self.kv_events, tier=1,
        )  # fmt: skip
        self.scheduler = Scheduler(
            self.kv, config.max_num_seqs, config.max_num_batched_tokens, config.aging_rate
        )
        if l3 is not None and not config.tiers.num_host_blocks:
            raise ValueError("an L3 store needs an L2 host pool: set the host cache size")
        runner.allocate_kv(config.num_blocks, config.block_size)
        self.tiers: KvTiers | None = None
        if config.tiers.num_host_blocks:
            self.tiers = KvTiers(
                self.kv, runner, config.tiers, model=runner.info.name, l3=l3, executor=executor, events=self.kv_events
            )
            self.scheduler.tiers = self.tiers
        self._next_background = 0
        self.last_schedule = SchedulerOutput()  # diagnostics of the latest step
        # live requests -> their live choices (waiting, running, or deferred: ``add_request``)
        self._seqs: dict[str, list[Sequence]] = {}
        self._aborted: list[RequestOutput] = []  # final outputs to deliver on the next step
        self._next_seq_id = 0
        self._prompt_tokens_total = 0
        self._computed_prompt_tokens_total = 0
        self._cached_prompt_tokens_total = 0
        self._generated_tokens_total = 0
        self._fast_forward = isinstance(runner, FastForwardRunner)  # once: a Protocol check is slow
        # How fast a decode step is at each batch size (the scheduler's admission reads it).
        self._modelled_speed = (
            ModelledSpeed(cast(FastForwardRunner, runner), config.max_num_seqs) if self._fast_forward else None
        )
        # ... else timed from the decode-only steps (a cost-model runner's timings would go unused)
        self._measured_speed = MeasuredSpeed() if self._modelled_speed is None else None
        self.grammars = grammars if grammars is not None else GrammarCache(runner.tokenizer, runner.info)
        self.masks = TokenMasks(runner.info.vocab_size)  # the token bitmasks of constrained rows

    # ---- requests ------------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        """Queue a request.  Raises ContextLengthExceeded (``check_context_window``) past the context
        window, InvalidRequest for a constraint that does not compile, ValueError for the rest.

        With ``sampling.n`` > 1 the request has n choices, one sequence each.  Choice 0 prefills
        the prompt; the others are deferred until it has computed the prompt, then join the queue
        and take its whole blocks from the prefix cache (each recomputes only the prompt's last,
        partial block).  Choice i samples with seed ``seed + i`` (or its own derived seed)."""
        prompt_len, max_tokens = len(req.prompt_token_ids), req.sampling.max_tokens
        if prompt_len == 0:
            raise ValueError("prompt must contain at least one token")
        if req.request_id in self._seqs or any(o.request_id == req.request_id for o in self._aborted):
            raise ValueError(f"duplicate request id {req.request_id!r}")
        info = self.runner.info
        check_context_window(info.max_model_len, max_tokens, prompt_len, param="messages")
        # The last sampled token never needs a slot; everything before it must fit the pool at once.
        blocks = -(-(prompt_len + max_tokens - 1) // self.config.block_size)
        if blocks > self.config.num_blocks:
            raise ValueError(
                f"request needs {blocks} KV blocks but the pool has {self.config.num_blocks}; "
                "lower max_tokens or the prompt length"
            )
        if not _in_vocabulary(req.prompt_token_ids, info.vocab_size):
            bad = next(t for t in req.prompt_token_ids if not 0 <= t < info.vocab_size)
            raise ValueError(f"token id {bad} outside the vocabulary (size {info.vocab_size})")
        if not req.detokenize and req.sampling.stop:
            raise ValueError("stop strings need text: a request with detokenize=False cannot have them")
        params = req.sampling
        grammar = req.grammar
        if params.constraint is not None:
            if self._fast_forward:
                raise ValueError(f"the {info.name} runner computes no logits: it cannot constrain the output")
            if grammar is None:
                grammar = self.grammars.compile(params.constraint).grammar
        arrival = self.clock() if req.arrival_time is None else req.arrival_time
        choices = [self._new_choice(req, index, arrival, grammar) for index in range(params.n)]
        first = choices[0]
        first.deferred_choices = choices[1:]
        self._seqs[req.request_id] = choices
        self._prompt_tokens_total += prompt_len
        self.scheduler.follow_preset(req.scheduler_preset)
        self.scheduler.seat_limit = req.seat_limit
        self.scheduler.add(first)
        if self.tiers is not None:
            self.tiers.on_arrival(first, arrival)

    def _new_choice(
        self, req: EngineRequest, index: int, arrival: float, grammar: xgr.CompiledGrammar | None
    ) -> Sequence:
        params = req.sampling
        generator = None
        if not params.greedy:
            seed = params.seed + index if params.seed is not None else self._derive_seed(req, index)
            generator = make_generator(seed)
        seq = Sequence(
            seq_id=self._next_seq_id,
            request=req,
            arrival_time=arrival,
            generator=generator,
            detokenizer=IncrementalDetokenizer(self.runner.tokenizer, req.prompt_token_ids, params.stop)
            if req.detokenize
            else NoText(),
            eos_token_ids=self.runner.info.eos_token_ids,
            index=index,
            matcher=None if grammar is None else xgr.GrammarMatcher(grammar),
        )
        self._next_seq_id += 1
        return seq

    def _release_deferred(self, seq: Sequence) -> None:
        """Queue the choices deferred behind ``seq``, now that its prompt is computed (and its
        whole blocks cached)."""
        for choice in seq.deferred_choices:
            self.scheduler.add(choice)
            if self.tiers is not None:
                self.tiers.on_arrival(choice, choice.arrival_time)
        seq.deferred_choices = []

    def abort_request(self, request_id: str) -> bool:
        """Release the request's blocks now; the final output (reason "abort") of each of its
        unfinished choices comes on the next step."""
        choices = self._seqs.pop(request_id, None)
        if choices is None:
            return False
        deferred = {id(seq) for choice in choices for seq in choice.deferred_choices}
        for seq in choices:
            if id(seq) in deferred:  # never queued: nothing to release
                seq.status = SequenceStatus.FINISHED
            else:
                self.scheduler.remove(seq)
                if self.tiers is not None:
                    self.tiers.forget(seq)
            seq.finish_reason = "abort"
            seq.deferred_choices = []
            if not seq.background:
                self._aborted.append(self._output(seq, [], "", True))
        return True

    # ---- the background lane and directives ----------------------------------------------------
    def pre_prefill(self, namespace: str | None, token_ids: Tokens[int], lineage: Lineage | None = None) -> str:
        """Queue the computation of ``token_ids``' K/V in the background lane (only in steps with
        nothing else to run; paused whenever live work can run).  Its whole blocks join the prefix
        cache.  Returns its id (``abort_request`` cancels it); it produces no output."""
        tokens = list(token_ids)
        self._check_pre_prefill(tokens)
        if lineage is None and namespace is not None:
            lineage = Lineage(namespace)
        elif lineage is not None and lineage.tenant != namespace:
            raise DirectiveError("the lineage's tenant must be the directive's")
        self._next_background += 1
        request = EngineRequest(
            f"pre-prefill-{self._next_background}", tokens, SamplingParams(max_tokens=1), priority=-math.inf,
            lineage=lineage, detokenize=False,
        )  # fmt: skip
        seq = Sequence(self._next_seq_id, request, self.clock(), None, NoText(), ())
        seq.background = True
        self._next_seq_id += 1
        self._seqs[request.request_id] = [seq]
        self.scheduler.add(seq)
        return request.request_id

    def _check_pre_prefill(self, tokens: Tokens[int]) -> None:
        block_size, info = self.config.block_size, self.runner.info
        if len(tokens) <= block_size:
            raise DirectiveError(f"pre_prefill needs token_ids longer than one block ({block_size} tokens)")
        if len(tokens) > info.max_model_len or -(-len(tokens) // block_size) > self.config.num_blocks:
            raise DirectiveError(f"pre_prefill of {len(tokens)} tokens does not fit this worker")
        if not _in_vocabulary(list(tokens), info.vocab_size):
            raise DirectiveError("pre_prefill token ids outside the vocabulary")

    def check_directive(self, directive: Directive) -> None:
        """Raise ``DirectiveError`` for a directive ``apply_directive`` would refuse; changes nothing."""
        if directive.kind == "pre_prefill":
            self._check_pre_prefill(directive.token_ids)
        elif self.tiers is None:
            raise DirectiveError("this worker has no KV tiers (its host cache size is 0)", missing_tier=True)
        else:
            self.tiers.check(directive)

    def apply_directive(self, directive: Directive) -> int:
        """Apply one cache directive; blocks (or pages) it touched.  Raises ``DirectiveError``,
        changing nothing, for one this engine cannot take (``check_directive``)."""
        self.check_directive(directive)
        if directive.kind == "pre_prefill":
            lineage = Lineage(directive.namespace or "", directive.workflow_id, directive.agent_id)
            self.pre_prefill(directive.namespace, directive.token_ids, lineage if directive.namespace else None)
            return len(directive.token_ids) // self.config.block_size
        assert self.tiers is not None
        return self.tiers.apply(directive, self.clock())

    def drain_kv_events(self) -> list[KvEvent]:
        """The KV events since the last call, in order ([] when built without ``kv_events``)."""
        events = self.kv_events
        if not events:
            return []
        drained = list(events)
        events.clear()
        return drained

    def kv_snapshot(self) -> list[KvEvent]:
        """Every tier's contents as events (CLEARED, then STORED per block; L3: the pages this
        engine wrote, as STORED only, since shared storage is not this engine's to clear), after
        the events not drained yet, so that applying all of them in order gives what each tier holds
        now.  For a subscriber that (re)started; [] when built without ``kv_events``."""
        if self.kv_events is None or self.kv.cache is None:
            return []
        events = self.drain_kv_events() + self.kv.cache.snapshot_events()
        if self.tiers is not None:
            l2_cache = self.tiers.l2.cache
            assert l2_cache is not None
            events += l2_cache.snapshot_events()
            by_namespace: dict[str | None, list[int]] = {}
            for namespace, block_hash in sorted(self.tiers.resident(3), key=lambda k: (str(k[0]), k[1])):
                by_namespace.setdefault(namespace, []).append(block_hash)
            events += [KvEvent("stored", 3, ns, tuple(hashes)) for ns, hashes in by_namespace.items()]
        return events

    def has_pending_transfers(self) -> bool:
        return self.tiers is not None and self.tiers.has_pending()

    def withdraw_unstarted(self) -> list[str]:
        """Remove every waiting request that has produced no token yet (never admitted, or preempted
        before its first token) and return their ids, in queue order.  They hold no blocks and
        get no final output: the caller tells their owners (a draining worker hands them back to
        be placed elsewhere).  A preempted request that already produced tokens stays."""
        # A request with n choices is unstarted while choice 0 waits with the others deferred.
        withdrawn = [
            seq for seq in self.scheduler.waiting
            if seq.num_output_tokens == 0 and len(seq.deferred_choices) == len(self._seqs[seq.request_id]) - 1
        ]  # fmt: skip
        for seq in withdrawn:
            del self._seqs[seq.request_id]
            self.scheduler.remove(seq)
            for choice in (seq, *seq.deferred_choices):
                choice.status, choice.finish_reason = SequenceStatus.FINISHED, "abort"
            seq.deferred_choices = []
        return [seq.request_id for seq in withdrawn]

    def has_unfinished(self) -> bool:
        return bool(self._seqs or self._aborted)

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        now = self.clock()
        tiers = self.tiers
        if tiers is not None:
            tiers.poll(now)
        batch = self.scheduler.schedule(now)
        self.last_schedule = batch
        self._cached_prompt_tokens_total += batch.cached_tokens
        if not batch.chunks:
            return outputs
        items: list[ForwardItem] = []
        samplers: list[Sequence] = []
        logprobs: list[TokenLogprob | None]
        for seq, n in batch.chunks:
            start = seq.num_computed_tokens
            want_logits = start + n == seq.num_tokens and not seq.background
            items.append(ForwardItem(seq.seq_id, seq.token_ids[start : start + n], start, seq.block_table, want_logits))
            if want_logits:
                samplers.append(seq)
        if self._fast_forward:  # the runner knows its tokens: no logits to build and sample
            token_ids = cast(FastForwardRunner, self.runner).forward_tokens(items)
            logprobs = [None] * len(token_ids)
        else:
            logits = self.runner.forward(items)
            token_ids = sample(*self._constrain(logits, samplers))
            logprobs = [
                None if seq.params.logprobs is None else token_logprobs(logits[i], token_ids[i], seq.params.logprobs)
                for i, seq in enumerate(samplers)
            ]
        started, now = now, self.clock()
        if self._measured_speed is not None and all(n == 1 for _, n in batch.chunks):
            self._measured_speed.observe(len(batch.chunks), now - started)
        for seq, n in batch.chunks:
            start = seq.num_computed_tokens
            self._computed_prompt_tokens_total += max(0, min(start + n, seq.prompt_len) - start)
            seq.num_computed_tokens += n
        for seq, token_id, logprob in zip(samplers, token_ids, logprobs, strict=True):
            outputs.append(self._append_token(seq, token_id, now, logprob))
        for seq, _ in batch.chunks:
            if seq.deferred_choices and seq.num_computed_tokens >= seq.prompt_len:
                if not seq.is_finished:
                    self.kv.cache_computed_blocks(seq)
                self._release_deferred(seq)
            if seq.is_finished:
                continue
            self.kv.cache_computed_blocks(seq)
            if seq.background and seq.num_uncomputed_tokens == 0:  # a pre-prefill is done
                del self._seqs[seq.request_id]
                self.scheduler.remove(seq)
        if tiers is not None:
            tiers.after_step(seq for seq, _ in batch.chunks)
        return outputs

    def _constrain(self, logits: torch.Tensor, samplers: list[Sequence]) -> tuple[torch.Tensor, list[SampleRow]]:
        """The logits to sample from, with each constrained row's disallowed tokens at -inf, and
        the rows' sampling inputs.  ``logits`` itself stays the model's (log probabilities read it)."""
        constrained = [i for i, seq in enumerate(samplers) if seq.matcher is not None]
        if not constrained:
            return logits, [seq.sample_row() for seq in samplers]
        matchers = [cast(xgr.GrammarMatcher, samplers[i].matcher) for i in constrained]
        bitmask = self.masks.fill(len(samplers), constrained, matchers)
        masked = logits.detach().to(dtype=torch.float32, copy=True)  # on the logits' device
        self.masks.apply(masked, bitmask, constrained)
        rows = []
        for i, seq in enumerate(samplers):
            grammar_ends = (
                seq.matcher is not None
                and seq.num_output_tokens < seq.params.min_tokens
                and allows_only(bitmask[i], seq.eos_token_ids)
            )
            rows.append(seq.sample_row(grammar_ends))
        return masked, rows

    # ---- decode runs (core/decode_run.py) ------------------------------------------------------
    def plan_decode_run(self, max_steps: int = 1 << 20) -> DecodeRun | None:
        """The next steps, if they are at least two plain decode steps of the running batch that
        nothing but a new or aborted request could change, up to the first step that finishes a
        sequence; None otherwise.  Changes nothing."""
        sched = self.scheduler
        running = sched.running
        if (
            not running
            or sched.waiting
            or self._aborted
            or len(running) > sched.max_num_batched_tokens
            or not self._fast_forward
        ):
            return None
        horizon = decode_horizon(running, max_steps)
        if horizon < 2:
            return None
        now = self.clock()
        seqs = tuple(sorted(running, key=lambda seq: sched.urgency(seq, now), reverse=True))  # batch order
        allocations = Allocations.of(seqs, self.kv.block_size)
        if allocations is None:
            return None
        allocatable = self.kv.num_allocatable_blocks
        num_steps = horizon if allocations.before(horizon) <= allocatable else allocations.step_of(allocatable)
        if num_steps < 2:
            return None
        computed = tuple(seq.num_computed_tokens for seq in seqs)
        return DecodeRun(
            seqs=seqs,
            start_computed=computed,
            step_seconds=tuple(cast(FastForwardRunner, self.runner).decode_run_seconds(computed, num_steps)),
            allocations=allocations,
            kv_blocks_used_before=self.kv.num_used_blocks,
            kv_blocks_free_before=self.kv.num_blocks - self.kv.num_used_blocks,
        )

    def advance_decode(self, run: DecodeRun, num_steps: int) -> list[RequestOutput]:
        """Take the first ``num_steps`` steps of ``run``: one output per sequence, with its
        ``num_steps`` new tokens (finished if they reach its limit).  Raises ValueError if the batch
        changed since the plan."""
        if not 1 <= num_steps <= run.num_steps:
            raise ValueError(f"num_steps must be in [1, {run.num_steps}], got {num_steps}")
        if self._aborted or any(
            seq.status is not SequenceStatus.RUNNING or seq.num_computed_tokens != computed
            for seq, computed in zip(run.seqs, run.start_computed, strict=True)
        ) or len(run.seqs) != len(self.scheduler.running):
            raise ValueError("the decode run is stale: the batch changed since it was planned")
        assert self._fast_forward
        runner = cast(FastForwardRunner, self.runner)
        new_tokens, finished = [], []
        for seq, computed in zip(run.seqs, run.start_computed, strict=True):
            tokens = runner.decode_tokens(seq.seq_id, computed, num_steps)
            seq.token_ids += tokens
            new_tokens.append(tokens)
            finished.append(seq.num_output_tokens >= seq.params.max_tokens)
        replay_block_events(run, num_steps, self.kv, finished, self._finish_by_length)
        if self.tiers is not None:
            self.tiers.after_step(run.seqs)
        runner.account_steps(run.step_seconds[:num_steps])
        self._generated_tokens_total += num_steps * len(run.seqs)
        self.last_schedule = SchedulerOutput()
        outputs = []
        for seq, tokens, done in zip(run.seqs, new_tokens, finished, strict=True):
            detok = seq.detokenizer
            if detok.wants_tokens:
                detok.extend(tokens)
                text = detok.take(check_stop=False) + (detok.flush() if done else "")
            else:
                text = ""
            outputs.append(self._output(seq, tokens, text, done))
        return outputs

    def _finish_by_length(self, seq: Sequence) -> None:
        seq.finish_reason = "length"
        self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        """Take a finished choice out of its request (the request ends with its last choice)."""
        choices = self._seqs[seq.request_id]
        choices.remove(seq)
        if not choices:
            del self._seqs[seq.request_id]
        self.scheduler.remove(seq)

    def _append_token(
        self, seq: Sequence, token_id: int, now: float, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        params = seq.params
        seq.token_ids.append(token_id)
        self._generated_tokens_total += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        reason: FinishReason | None = None
        detok = seq.detokenizer
        matcher = seq.matcher
        # A grammar that accepted a stop token, or cannot take this one, ends the output.
        grammar_done = matcher is not None and (not matcher.accept_token(token_id) or matcher.is_terminated())
        if grammar_done and token_id in seq.eos_token_ids:
            reason = "stop"
            text = ""
        elif token_id in seq.eos_token_ids and not params.ignore_eos:
            reason = "stop"  # min_tokens is enforced by the sampler, which bans EOS until then
            text = ""
        elif detok.wants_tokens:
            detok.append(token_id)
            text = detok.take(check_stop=seq.num_output_tokens >= params.min_tokens)
            if detok.stopped:
                reason = "stop"
        else:
            text = ""
        if reason is None and grammar_done:
            reason = "stop"
        if reason is None and seq.num_output_tokens >= params.max_tokens:
            reason = "length"
        if reason is not None:
            text += detok.flush()
            seq.finish_reason = reason
            self._finish(seq)
        output = self._output(seq, [token_id], text, reason is not None, () if logprob is None else (logprob,))
        if detok.stopped:
            output.stop_sequence = detok.matched_stop
        return output

    def _output(
        self, seq: Sequence, new_token_ids: list[int], text: str, finished: bool, logprobs: tuple[TokenLogprob, ...] = ()
    ) -> RequestOutput:
        # Positional (in field order): one of these per row per step.
        return RequestOutput(
            seq.request_id, new_token_ids, text, finished, seq.finish_reason, seq.prompt_len,
            seq.cached_tokens or 0, seq.num_output_tokens, seq.first_token_time, logprobs, None, seq.index,
        )  # fmt: skip

    def _derive_seed(self, req: EngineRequest, index: int = 0) -> int:
        key = f"{self.config.seed}:{req.request_id}" + (f":{index}" if index else "")
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & (2**63 - 1)

    # ---- introspection -------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.config.num_blocks,
            kv_blocks_cached=self.kv.num_cached_only_blocks,
            preemptions_total=self.scheduler.preemptions_total,
            prompt_tokens_total=self._prompt_tokens_total,
            computed_prompt_tokens_total=self._computed_prompt_tokens_total,
            cached_prompt_tokens_total=self._cached_prompt_tokens_total,
            generated_tokens_total=self._generated_tokens_total,
            max_num_seqs=self.config.max_num_seqs,
            decode_speed=self.decode_speed(),
            **self._tier_stats(),
        )

    def decode_speed(self) -> DecodeSpeed | None:
        """A decode step's cost at each batch size now (``core/decode_speed.py``); None: not known yet."""
        if self._modelled_speed is not None:
            return self._modelled_speed.speed(seq.num_tokens for seq in self.scheduler.running)
        assert self._measured_speed is not None
        return self._measured_speed.speed()

    def _tier_stats(self) -> dict[str, Any]:
        tiers = self.tiers
        if tiers is None:
            return {"hit_tokens": (self._cached_prompt_tokens_total, 0, 0)}
        c = tiers.counters
        return {
            "l2_blocks_used": tiers.l2.num_used_blocks,
            "l2_blocks_total": tiers.l2.num_blocks,
            "hit_tokens": (c.hit_tokens[1], c.hit_tokens[2], c.hit_tokens[3]),
            "l3_backend": tiers.l3.name if tiers.l3 is not None else "",
            "demoted_blocks_total": c.demoted_blocks,
            "promoted_blocks_total": c.promoted_blocks,
            "l3_written_blocks_total": c.l3_written_blocks,
            "l3_fetched_blocks_total": c.l3_fetched_blocks,
            "l3_errors_total": c.l3_errors,
        }

    def check_integrity(self) -> None:
        """Assert the block accounting and queue invariants (tests call it after every operation)."""
        running, waiting = self.scheduler.running, self.scheduler.waiting
        assert all(s.status is SequenceStatus.RUNNING for s in running)
        assert all(s.status is SequenceStatus.WAITING and not s.block_table for s in waiting)
        assert len(running) <= self.config.max_num_seqs
        deferred = [d for s in (*running, *waiting) for d in s.deferred_choices]
        assert all(s.status is SequenceStatus.WAITING and not s.block_table for s in deferred)
        live = {id(s) for s in (*running, *waiting, *deferred)}
        assert live == {id(s) for choices in self._seqs.values() for s in choices}
        assert len(live) == len(running) + len(waiting) + len(deferred)
        for seq in running:
            assert seq.num_uncomputed_tokens >= 1, seq
        assert self.scheduler.num_background == sum(s.background for s in (*running, *waiting))
        tiers = self.tiers
        self.kv.check_integrity([*running, *waiting], tiers.retained_blocks(1) if tiers is not None else ())
        if tiers is not None:
            tiers.check_integrity()
