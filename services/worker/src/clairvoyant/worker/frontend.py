"""The worker's front of the engine: what both edges (``grpc_api``, ``http_api``) call, with no
transport type in it.

Turns a prompt (chat messages, text or token ids) into an ``EngineRequest``, enforcing the
context window before anything is allocated; streams a request's outputs, counting them in
``metrics``; hands back the requests still waiting when the worker drains; exports and imports cached prefixes (KV migration, ``core/kv_transfer.py``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import xgrammar as xgr

from clairvoyant.contracts.v1 import cachemgr_pb2
from clairvoyant.core.context_window import check_context_window
from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.core.structured import OutputConstraint
from clairvoyant.worker import metrics
from clairvoyant.worker.core.engine import EngineRequest, RequestOutput
from clairvoyant.worker.core.kv_transfer import (
    ImportResult,
    KvPrefix,
    check_prefix,
    export_prefix,
    import_prefix,
)
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.directives import apply_directives
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.kv_wire import KvLayout
from clairvoyant.worker.runners.base import CopiesKv, EmulatesKvTransfer, FastForwardRunner, ModelRunner


class Frontend(Protocol):
    """What the edges call: ``WorkerFrontend`` (our engine) and ``engines.frontend.ExternalFrontend``
    (a peer engine's server).  KV export and import are ``WorkerFrontend``'s alone."""

    @property
    def worker_id(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def max_model_len(self) -> int: ...
    async def encode(self, prompt: PromptInput) -> list[int]: ...
    def token_text(self, token_id: int) -> str: ...
    def default_max_tokens(self, prompt_len: int) -> int: ...
    def build_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        priority: float = 0.0,
        lineage: Lineage | None = None,
        scheduler_preset: str = "",
        program_wait_s: float = 0.0,
        program_service_s: float = 0.0,
    ) -> EngineRequest: ...
    def run(self, request: EngineRequest) -> AsyncIterator[RequestOutput]: ...
    def draining_error(self) -> Unavailable: ...
    async def hand_back_waiting(self) -> int: ...
    async def apply_directives(self, messages: Sequence[cachemgr_pb2.CacheDirective]) -> int: ...


@dataclass(frozen=True)
class PromptInput:
    """Exactly one of ``messages``, ``text`` and ``token_ids`` is set.  ``tools`` (OpenAI function
    tool dicts) go to the chat template with ``messages``."""

    messages: Sequence[dict[str, Any]] | None = None
    text: str | None = None
    token_ids: Sequence[int] | None = None
    tools: Sequence[dict[str, Any]] | None = None


_counter = itertools.count()


class WorkerFrontend:
    """One model runner and its engine loop, as both edges see them.  ``tokenize`` and
    ``build_request`` raise InvalidRequest (ContextLengthExceeded past the window) before the
    engine sees anything; ``run`` compiles the request's constraint (InvalidRequest when it does
    not compile, before anything is queued), then streams until every choice finishes or the
    request is cancelled."""

    def __init__(
        self,
        runner: ModelRunner,
        engine: AsyncEngine,
        worker_id: str,
        *,
        transfer_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        compile_threads: int = 2,
    ) -> None:
        """``transfer_sleep``: how an import waits out the modelled transfer time of a runner
        without tensors (``EmulatesKvTransfer``); tests pass one that records it.
        ``compile_threads``: how many constraints compile at once."""
        self.runner = runner
        self.engine = engine
        self.worker_id = worker_id
        self._transfer_sleep = transfer_sleep
        # Grammars compile here, never on the engine thread: other requests go on decoding.
        self._compile_pool = ThreadPoolExecutor(max_workers=compile_threads, thread_name_prefix="grammar")

    @property
    def model_name(self) -> str:
        return self.runner.info.name

    @property
    def max_model_len(self) -> int:
        return self.runner.info.max_model_len

    @property
    def kv_layout(self) -> KvLayout:
        info, tensors = self.runner.info, isinstance(self.runner, CopiesKv)
        return KvLayout(info.name, info.num_layers, info.num_kv_heads, info.head_dim, info.dtype, tensors)

    def tokenize(self, prompt: PromptInput) -> list[int]:
        tokenizer = self.runner.tokenizer
        if prompt.messages is not None:
            if prompt.tools:
                return tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tools=prompt.tools)
            return tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True)
        if prompt.text is not None:
            return tokenizer.encode(prompt.text)
        if prompt.token_ids is not None:
            vocab = self.runner.info.vocab_size
            bad = [t for t in prompt.token_ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequest(f"token ids out of range [0, {vocab}): {bad[:5]}", param="prompt")
            return list(prompt.token_ids)
        raise InvalidRequest("a prompt is required", param="prompt")

    async def encode(self, prompt: PromptInput) -> list[int]:
        """``tokenize``, as the edges call every frontend (a peer engine's tokenizes over HTTP)."""
        return self.tokenize(prompt)

    def token_text(self, token_id: int) -> str:
        """One token's text (log probabilities name their tokens)."""
        return self.runner.tokenizer.decode([token_id])

    async def apply_directives(self, messages: Sequence[cachemgr_pb2.CacheDirective]) -> int:
        """Check, then apply a batch (``directives.apply_directives``); raises DirectiveRejected."""
        return await apply_directives(self.engine, messages, self.worker_id)

    def build_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
        *,
        priority: float = 0.0,
        lineage: Lineage | None = None,
        scheduler_preset: str = "",
        program_wait_s: float = 0.0,
        program_service_s: float = 0.0,
    ) -> EngineRequest:
        """Checks the context window and the logit bias's token ids, then builds the engine
        request.  Raises InvalidRequest."""
        if sampling.logprobs is not None and isinstance(self.runner, FastForwardRunner):
            raise InvalidRequest(f"logprobs: the {self.runner.info.name} runner computes no logits", param="logprobs")
        if sampling.constraint is not None and isinstance(self.runner, FastForwardRunner):
            raise InvalidRequest(
                f"constrained output: the {self.runner.info.name} runner computes no logits to mask",
                param="response_format",
            )
        vocab = self.runner.info.vocab_size
        outside = [token for token, _ in sampling.logit_bias if token >= vocab]
        if outside:
            raise InvalidRequest(
                f"logit_bias names token ids past the vocabulary of {vocab}: {outside[:5]}", param="logit_bias"
            )
        return new_request(
            self.max_model_len, request_id, prompt_ids, sampling, priority=priority, lineage=lineage,
            scheduler_preset=scheduler_preset, program_wait_s=program_wait_s, program_service_s=program_service_s,
        )  # fmt: skip

    def default_max_tokens(self, prompt_len: int) -> int:
        """What an unset max_tokens means: the rest of the context window, or of the KV pool."""
        config = self.engine.engine.config
        pool_tokens = config.num_blocks * config.block_size
        return max(1, min(self.max_model_len, pool_tokens) - prompt_len)

    async def export_kv(
        self, namespace: str, *, token_ids: Sequence[int] | None = None, workflow_id: str | None = None
    ) -> KvPrefix | None:
        """The cached prefix (``kv_transfer.export_prefix``), read on the engine thread; None when
        nothing of it is cached."""
        prefix = await self.engine.call(
            lambda engine: export_prefix(
                engine.kv, engine.runner, namespace, token_ids=token_ids, workflow_id=workflow_id
            )
        )
        if prefix is not None:
            metrics.KV_MIGRATED.labels("export").inc(prefix.num_tokens)
        return prefix

    async def import_kv(self, prefix: KvPrefix) -> ImportResult | None:
        """Cache ``prefix`` (``kv_transfer.import_prefix``); None when the pool has no room.
        Raises ``KvTransferError`` when it does not fit this runner.

        A runner without tensors first waits out the transfer its cost model predicts for the
        prefix's tokens: the prefix counts as arrived only then (and the engine goes on stepping
        meanwhile, as it would while a NIC writes into its memory)."""
        check_prefix(self.runner, prefix)
        if isinstance(self.runner, EmulatesKvTransfer):
            await self._transfer_sleep(self.runner.kv_transfer_seconds(prefix.num_tokens))
        result = await self.engine.call(lambda engine: import_prefix(engine.kv, engine.runner, prefix))
        if result is not None:
            metrics.KV_MIGRATED.labels("import").inc(result.imported_tokens)
        return result

    def draining_error(self) -> Unavailable:
        """What a request this draining worker will not serve ends with: the caller places it
        elsewhere (the gateway re-places a request whose worker is UNAVAILABLE before answering)."""
        return Unavailable(f"worker {self.worker_id} is draining; re-place the request")

    async def hand_back_waiting(self) -> int:
        """End every request still waiting in the engine that has produced no token with
        ``draining_error``; returns how many.  Requests that have started finish here."""
        handed_back = await self.engine.withdraw_unstarted(lambda _: self.draining_error())
        return len(handed_back)

    async def compile_constraint(self, constraint: OutputConstraint) -> xgr.CompiledGrammar:
        """``constraint`` compiled for this model (``core.grammar.GrammarCache``, shared with the
        engine), on the compile pool; counts compiles and cache hits.  Raises InvalidRequest."""
        grammars = self.engine.engine.grammars
        start = time.perf_counter()
        try:
            compiled = await asyncio.get_running_loop().run_in_executor(
                self._compile_pool, grammars.compile, constraint
            )
        except InvalidRequest:
            metrics.GRAMMAR_COMPILES.labels(constraint.kind, "invalid").inc()
            raise
        if compiled.cache_hit:
            metrics.GRAMMAR_CACHE_HITS.inc()
        else:
            metrics.GRAMMAR_COMPILES.labels(constraint.kind, "ok").inc()
            metrics.GRAMMAR_COMPILE_SECONDS.observe(time.perf_counter() - start)
        return compiled.grammar

    async def run(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs (every choice's, tagged with its index), recording
        latency metrics and the final status.  A constrained request's grammar compiles first."""
        constraint = request.sampling.constraint
        if constraint is not None and request.grammar is None:
            request.grammar = await self.compile_constraint(constraint)
        async for output in observed(self.engine.generate(request)):
            yield output


def new_request(
    max_model_len: int,
    request_id: str,
    prompt_ids: list[int],
    sampling: SamplingParams,
    *,
    priority: float = 0.0,
    lineage: Lineage | None = None,
    scheduler_preset: str = "",
    program_wait_s: float = 0.0,
    program_service_s: float = 0.0,
) -> EngineRequest:
    """Checks the context window, then builds the engine request.  Raises InvalidRequest."""
    if not prompt_ids:
        raise InvalidRequest("the prompt is empty after tokenization", param="messages")
    check_context_window(max_model_len, sampling.max_tokens, len(prompt_ids), param="messages")
    return EngineRequest(
        request_id=request_id or f"w{next(_counter)}",
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        priority=priority,
        lineage=lineage,
        scheduler_preset=scheduler_preset,
        program_wait_s=program_wait_s,
        program_service_s=program_service_s,
    )


async def observed(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
    """``outputs``, recording TTFT, end-to-end latency and the request's final status."""
    start = time.monotonic()
    first = True
    status = "cancelled"
    try:
        async for output in outputs:
            if first and output.new_token_ids:
                metrics.TTFT.observe(time.monotonic() - start)
                first = False
            if output.finished:
                status = "aborted" if output.finish_reason == "abort" else "ok"
            yield output
    except InvalidRequest:
        status = "rejected"
        raise
    except Unavailable:  # handed back by a drain, to be placed elsewhere
        status = "handed_back"
        raise
    except Exception:
        status = "error"
        raise
    finally:
        metrics.REQUESTS.labels(status).inc()
        if status == "ok":
            metrics.E2E.observe(time.monotonic() - start)
