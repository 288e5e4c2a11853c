"""The worker's front of a peer engine: what the gRPC edge (``grpc_api.WorkerServicer``) calls,
as it calls ``WorkerFrontend`` for our own engine.

* ``encode`` tokenizes through the engine (its tokenizer and chat template), ``build_request``
  checks the context window, ``run`` streams through the adapter.
* Priority: the placement's ``base_priority`` goes to the engine's per-request priority.
* Drain: ``hand_back_waiting`` ends every request that has produced no token yet with
  UNAVAILABLE (its HTTP stream is closed, so the engine aborts it), as our engine hands back its
  queue.
* Directives: ``pre_prefill`` runs a 1-token generation at the lowest priority; a kind the engine
  has no counterpart for is refused (``DirectiveRejected`` with ``missing_tier``, so gRPC answers
  FAILED_PRECONDITION) and the whole batch with it.
* KV export and import: unsupported (UNIMPLEMENTED at the edge).
* Stats: ``refresh`` reads the engine's metrics (each heartbeat); ``stats`` is the last reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import httpx

from clairvoyant.contracts.v1 import cachemgr_pb2
from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.worker import metrics
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.core.types import EngineRequest, EngineStats, RequestOutput
from clairvoyant.worker.directives import DirectiveRejected, decode_directive
from clairvoyant.worker.engines.adapter import EngineAdapter, EngineCall, parse_metrics
from clairvoyant.worker.engines.kv_bridge import RecentRequests, RequestInfo
from clairvoyant.worker.frontend import PromptInput, new_request, observed
from clairvoyant.worker.runners.base import ModelInfo

logger = logging.getLogger(__name__)

PRE_PREFILL_PRIORITY = -1e9  # background work never outranks live requests


def engine_model_info(name: str, max_model_len: int) -> ModelInfo:
    """The ``ModelInfo`` the heartbeat reports for a peer engine (it knows a name and a window)."""
    return ModelInfo(name, 0, max_model_len, (), 0, 0, 0)


@dataclass
class _Waiting:
    """A request that has produced no token yet: a drain hands it back."""

    handed_back: asyncio.Future[None]


class ExternalFrontend:
    def __init__(
        self,
        adapter: EngineAdapter,
        client: httpx.AsyncClient,
        worker_id: str,
        info: ModelInfo,
        *,
        max_num_seqs: int,
        recent: RecentRequests | None = None,
    ) -> None:
        self.adapter = adapter
        self.client = client
        self.worker_id = worker_id
        self.info = info
        self.max_num_seqs = max_num_seqs
        self.recent = recent or RecentRequests()
        self._waiting: dict[str, _Waiting] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._stats = EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, max_num_seqs)
        self.engine_up = False
        self.engine_block_size = 0  # the engine's KV block, in tokens (from its metrics); 0 unknown

    # -- what the edges read -------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.info.name

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    async def encode(self, prompt: PromptInput) -> list[int]:
        if prompt.token_ids is not None:
            return list(prompt.token_ids)
        try:
            return await self.adapter.tokenize(self.client, self.model_name, prompt)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"{self.adapter.name} at {self.client.base_url} cannot be reached: {exc}"
            ) from exc

    def token_text(self, token_id: int) -> str:
        """Unused: the engine names its log probabilities' tokens itself."""
        return ""

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
        """Checks the context window, and refuses ``n`` > 1 (the adapters stream one choice per
        request).  The engine ranks by ``priority`` alone: the preset's engine rule and the
        program times are ours, and have no counterpart there."""
        if sampling.n > 1:
            raise InvalidRequest(f"n > 1: the worker fronting {self.adapter.name} serves one choice per request", param="n")
        return new_request(
            self.max_model_len, request_id, prompt_ids, sampling, priority=priority, lineage=lineage
        )

    def default_max_tokens(self, prompt_len: int) -> int:
        return max(1, self.max_model_len - prompt_len)

    def draining_error(self) -> Unavailable:
        return Unavailable(f"worker {self.worker_id} is draining; re-place the request")

    async def hand_back_waiting(self) -> int:
        waiting = list(self._waiting.values())
        for entry in waiting:
            if not entry.handed_back.done():
                entry.handed_back.set_result(None)
        return len(waiting)

    async def run(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        async for output in observed(self._stream(request)):
            yield output

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        lineage = request.lineage or Lineage(tenant="default", request_id=request.request_id)
        self.recent.add(request.request_id, RequestInfo(lineage, len(request.prompt_token_ids)))
        call = EngineCall(
            request.request_id,
            request.prompt_token_ids,
            request.sampling,
            request.priority,
            lineage.tenant or "default",
        )
        outputs = self.adapter.generate(self.client, self.model_name, call)
        waiting = _Waiting(asyncio.get_running_loop().create_future())
        self._waiting[request.request_id] = waiting
        try:
            while True:
                step = asyncio.ensure_future(anext(outputs))
                if request.request_id in self._waiting:
                    await asyncio.wait((step, waiting.handed_back), return_when=asyncio.FIRST_COMPLETED)
                    if not step.done():  # handed back by a drain before its first token
                        step.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await step
                        raise self.draining_error()
                try:
                    output = await step
                except StopAsyncIteration:
                    return
                except httpx.HTTPError as exc:
                    raise Unavailable(f"{self.adapter.name} failed mid-request: {exc}") from exc
                if output.new_token_ids or output.finished:
                    self._waiting.pop(request.request_id, None)
                yield output
                if output.finished:
                    return
        finally:
            self._waiting.pop(request.request_id, None)
            await outputs.aclose()  # type: ignore[attr-defined]  # closes the stream: the engine aborts it

    # -- directives ----------------------------------------------------------------------
    async def apply_directives(self, messages: Sequence[cachemgr_pb2.CacheDirective]) -> int:
        directives = [decode_directive(msg, index, self.worker_id) for index, msg in enumerate(messages)]
        for index, directive in enumerate(directives):
            if directive.kind in self.adapter.unsupported_directives:
                raise DirectiveRejected(
                    index, f"{directive.kind}: {self.adapter.name} has no counterpart", missing_tier=True
                )
            if directive.kind == "pre_prefill" and not directive.token_ids:
                raise DirectiveRejected(index, "pre_prefill needs token_ids")
            if directive.kind == "pre_prefill" and len(directive.token_ids) >= self.max_model_len:
                raise DirectiveRejected(
                    index, f"pre_prefill of {len(directive.token_ids)} tokens exceeds the window"
                )
        for directive in directives:
            lineage = Lineage(
                tenant=directive.namespace or "default", workflow_id=directive.workflow_id,
                agent_id=directive.agent_id, request_id=directive.request_id,
            )  # fmt: skip
            request = new_request(
                self.max_model_len, "", list(directive.token_ids), SamplingParams(max_tokens=1, temperature=0.0),
                priority=PRE_PREFILL_PRIORITY, lineage=lineage,
            )  # fmt: skip
            task = asyncio.create_task(self._drain_silently(request))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return len(directives)

    async def _drain_silently(self, request: EngineRequest) -> None:
        try:
            async for _ in self.run(request):
                pass
        except Exception as exc:
            logger.warning("pre_prefill %s failed: %s", request.request_id, exc)

    # -- stats ---------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        return self._stats

    async def refresh(self) -> bool:
        """Read the engine's metrics; False (and the last reading kept) when it does not answer."""
        try:
            response = await self.client.get("/metrics")
            response.raise_for_status()
            parsed = parse_metrics(response.text)
            self._stats = self.adapter.stats(parsed, self.max_num_seqs)
            self.engine_block_size = self.adapter.block_size(parsed) or self.engine_block_size
            self.engine_up = True
        except (httpx.HTTPError, ValueError) as exc:
            if self.engine_up:
                logger.warning("%s metrics unavailable: %s", self.adapter.name, exc)
            self.engine_up = False
        metrics.ENGINE_UP.set(1 if self.engine_up else 0)
        metrics.record_stats(self._stats)
        return self.engine_up

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
