"""The Worker gRPC service: a thin adapter from protobuf to ``WorkerFrontend``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.grpc_errors import abort
from clairvoyant.core.telemetry import extract_context, tracer
from clairvoyant.core.wire import constraint_from_proto
from clairvoyant.worker.block_hashes import SequenceHasher
from clairvoyant.worker.core.kv_transfer import KvTransferError
from clairvoyant.worker.core.sampling import SamplingParams, TokenLogprob
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.directives import DirectiveRejected
from clairvoyant.worker.frontend import Frontend, PromptInput, WorkerFrontend
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.kv_wire import PrefixAssembler
from clairvoyant.worker.metrics import DIRECTIVES

logger = logging.getLogger(__name__)
_tracer = tracer(__name__)


def prompt_input(msg: worker_pb2.GenerateRequest | worker_pb2.PrefillRequest) -> PromptInput:
    kind = msg.WhichOneof("input")
    if kind == "chat":
        return PromptInput(messages=[{"role": m.role, "content": m.content} for m in msg.chat.messages])
    if kind == "prompt":
        return PromptInput(text=msg.prompt)
    if kind == "token_ids":
        return PromptInput(token_ids=list(msg.token_ids.ids))
    raise InvalidRequest("one of chat, prompt or token_ids is required", param="input")


def sampling_params(msg: common_pb2.SamplingParams, default_max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else default_max_tokens,
        temperature=msg.temperature if msg.HasField("temperature") else 1.0,
        top_p=msg.top_p if msg.HasField("top_p") else 1.0,
        seed=msg.seed if msg.HasField("seed") else None,
        stop=tuple(msg.stop),
        ignore_eos=msg.ignore_eos,
        min_tokens=msg.min_tokens,
        frequency_penalty=msg.frequency_penalty if msg.HasField("frequency_penalty") else 0.0,
        presence_penalty=msg.presence_penalty if msg.HasField("presence_penalty") else 0.0,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        logit_bias=tuple(sorted(msg.logit_bias.items())),
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        constraint=constraint_from_proto(msg.constraint) if msg.HasField("constraint") else None,
        n=msg.n or 1,
    )


def logprobs_proto(logprobs: Sequence[TokenLogprob], text_of: Callable[[int], str]) -> list[common_pb2.TokenLogprob]:
    """Log probabilities as the contract carries them, each token named by its text."""
    out = []
    for lp in logprobs:
        top_texts = lp.top_texts or tuple(text_of(token) for token, _ in lp.top)
        out.append(
            common_pb2.TokenLogprob(
                token_id=lp.token_id,
                token=lp.text if lp.text is not None else text_of(lp.token_id),
                logprob=lp.logprob,
                top=[
                    common_pb2.TopLogprob(token_id=token, token=text, logprob=value)
                    for (token, value), text in zip(lp.top, top_texts, strict=True)
                ],
            )
        )
    return out


def lineage(tenant: str, meta: common_pb2.AppMetadata, request_id: str) -> Lineage:
    return Lineage(
        tenant=tenant or "default",
        workflow_id=meta.workflow_id,
        agent_id=meta.agent_id,
        request_id=request_id,
    )


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, frontend: Frontend, heartbeat: Heartbeat) -> None:
        self.frontend = frontend
        self.heartbeat = heartbeat

    async def Generate(  # noqa: N802 - gRPC method name
        self, request: worker_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        request_id = request.request_id or f"req-{uuid.uuid4().hex}"
        self.heartbeat.held_requests.add(request_id)
        try:
            async for reply in self._generate(request, request_id, context):
                yield reply
        finally:
            self.heartbeat.held_requests.discard(request_id)

    async def _generate(
        self, request: worker_pb2.GenerateRequest, request_id: str, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.GenerateResponse]:
        parent = extract_context(context.invocation_metadata())
        with _tracer.start_as_current_span("worker.generate", context=parent) as span:
            span.set_attribute("cv.request_id", request_id)
            span.set_attribute("cv.worker_id", self.frontend.worker_id)
            try:
                if self.heartbeat.draining:
                    raise self.frontend.draining_error()
                if request.model and request.model != self.frontend.model_name:
                    raise InvalidRequest(
                        f"this worker serves {self.frontend.model_name!r}, not {request.model!r}",
                        param="model",
                    )
                ids = await self.frontend.encode(prompt_input(request))
                sampling = sampling_params(request.sampling, self.frontend.default_max_tokens(len(ids)))
                engine_request = self.frontend.build_request(
                    request_id,
                    ids,
                    sampling,
                    priority=request.base_priority,
                    lineage=lineage(request.tenant, request.app_metadata, request_id),
                    scheduler_preset=request.scheduler_preset,
                    program_wait_s=request.program_wait_s,
                    program_service_s=request.program_service_s,
                )
            except ClairvoyantError as err:
                await abort(context, err)
            except ValueError as exc:
                await abort(context, InvalidRequest(str(exc), param="sampling"))
            span.set_attribute("cv.prompt_tokens", len(ids))
            span.set_attribute("cv.base_priority", request.base_priority)
            span.set_attribute("cv.scheduler_preset", request.scheduler_preset)
            first = True
            start = time.monotonic()
            hasher = SequenceHasher(ids)  # the prompt's chain, hashed while the engine prefills
            output_ids: list[int] = []
            try:
                async for out in self.frontend.run(engine_request):
                    output_ids.extend(out.new_token_ids)
                    reply = worker_pb2.GenerateResponse(
                        request_id=request_id, text=out.new_text, token_ids=out.new_token_ids
                    )
                    if out.logprobs:
                        reply.logprobs.extend(logprobs_proto(out.logprobs, self.frontend.token_text))
                    if first:
                        reply.prompt_tokens = out.prompt_tokens
                        if out.new_token_ids:
                            span.add_event("first_token", {"cv.prefill_s": time.monotonic() - start})
                            first = False
                    if out.finished:
                        reply.finish_reason = out.finish_reason or "stop"
                        if out.stop_sequence is not None:
                            reply.stop_sequence = out.stop_sequence
                        reply.usage.CopyFrom(
                            common_pb2.Usage(
                                prompt_tokens=out.prompt_tokens,
                                completion_tokens=out.completion_tokens,
                                total_tokens=out.prompt_tokens + out.completion_tokens,
                                cached_tokens=out.cached_tokens,
                            )
                        )
                        prompt_hashes, response_hashes = await hasher.finish(output_ids)
                        reply.prompt_block_hashes.extend(prompt_hashes)
                        reply.response_block_hashes.extend(response_hashes)
                        reply.prompt_token_ids.extend(ids)  # the cache manager's workflow history
                        span.set_attribute("cv.completion_tokens", out.completion_tokens)
                        span.set_attribute("cv.cached_tokens", out.cached_tokens)
                    yield reply
            except ClairvoyantError as err:  # a drain handed it back (Unavailable), or the engine refused it
                await abort(context, err)
            except ValueError as exc:  # the engine refused it (e.g. larger than the whole KV pool)
                await abort(context, InvalidRequest(str(exc), param="messages"))
            finally:
                hasher.cancel()

    async def Prefill(  # noqa: N802
        self, request: worker_pb2.PrefillRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PrefillResponse:
        """Computes the prompt's KV (one token is sampled and discarded); it stays in the prefix cache."""
        request_id = request.request_id or f"prefill-{uuid.uuid4().hex}"
        try:
            ids = await self.frontend.encode(prompt_input(request))
            engine_request = self.frontend.build_request(
                request_id,
                ids,
                SamplingParams(max_tokens=1, temperature=0.0),
                priority=-1e9,  # background work never outranks live requests
                lineage=lineage(request.tenant, request.app_metadata, request_id),
            )
        except ClairvoyantError as err:
            await abort(context, err)
        cached = 0
        try:
            async for out in self.frontend.run(engine_request):
                cached = out.cached_tokens
        except ValueError as exc:
            await abort(context, InvalidRequest(str(exc), param="input"))
        return worker_pb2.PrefillResponse(prompt_tokens=len(ids), cached_tokens=cached)

    async def ApplyDirectives(  # noqa: N802
        self, request: worker_pb2.ApplyDirectivesRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ApplyDirectivesResponse:
        """All the directives or none: the batch is checked before any is applied."""
        try:
            applied = await self.frontend.apply_directives(request.directives)
            DIRECTIVES.labels("grpc", "applied").inc()
            return worker_pb2.ApplyDirectivesResponse(applied=applied)
        except DirectiveRejected as exc:
            DIRECTIVES.labels("grpc", "rejected").inc()
            code = (
                grpc.StatusCode.FAILED_PRECONDITION if exc.missing_tier else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, str(exc))
            raise AssertionError("unreachable") from exc

    async def ExportKV(  # noqa: N802
        self, request: worker_pb2.ExportKVRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[worker_pb2.KVChunk]:
        """The cached prefix of the request's tokens, or of its session, one chunk per layer."""
        frontend = await self._kv_frontend(context)
        if request.model and request.model != frontend.model_name:
            wrong = f"this worker serves {frontend.model_name!r}, not {request.model!r}"
            await abort(context, InvalidRequest(wrong, param="model"))
        if not request.token_ids and not request.workflow_id:
            unnamed = InvalidRequest("name the prefix: token_ids or workflow_id", param="token_ids")
            await abort(context, unnamed)
        namespace = request.tenant or "default"  # as Generate's lineage has it
        prefix = await frontend.export_kv(
            namespace, token_ids=list(request.token_ids) or None, workflow_id=request.workflow_id or None
        )
        if prefix is None:
            what = "these tokens" if request.token_ids else f"session {request.workflow_id!r}"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"nothing of {what} is cached for {namespace!r}")
        assert prefix is not None
        logger.info("exporting %d cached tokens (%s)", prefix.num_tokens, request.request_id)
        for chunk in frontend.kv_layout.chunks(prefix, request.request_id):
            yield chunk

    async def ImportKV(  # noqa: N802
        self, request_iterator: AsyncIterator[worker_pb2.KVChunk], context: grpc.aio.ServicerContext
    ) -> worker_pb2.ImportKVResponse:
        """Collect the whole stream, check it, then cache the prefix: all or nothing."""
        frontend = await self._kv_frontend(context)
        assembler = PrefixAssembler(frontend.kv_layout)
        try:
            async for chunk in request_iterator:
                assembler.add(chunk)
            prefix = assembler.finish()
            result = await frontend.import_kv(prefix)
        except ClairvoyantError as err:
            await abort(context, err)
        except KvTransferError as exc:
            await abort(context, InvalidRequest(str(exc), param="chunks"))
        if result is None:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"no room in the KV pool for {prefix.num_tokens} tokens"
            )
        assert result is not None
        tokens, imported = result
        return worker_pb2.ImportKVResponse(tokens=tokens, imported_tokens=imported)

    async def _kv_frontend(self, context: grpc.aio.ServicerContext) -> WorkerFrontend:
        """Our own engine's frontend: KV export and import move our engine's blocks, which a peer
        engine does not expose (UNIMPLEMENTED)."""
        if not isinstance(self.frontend, WorkerFrontend):
            engine = self.heartbeat.engine_name
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, f"KV export and import are not available over {engine}"
            )
        assert isinstance(self.frontend, WorkerFrontend)
        return self.frontend

    async def Drain(  # noqa: N802
        self, request: worker_pb2.WorkerDrainRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerDrainResponse:
        """Refuse new work and hand back the waiting requests, or (``drain`` false) take work again."""
        self.heartbeat.draining = request.drain
        if not request.drain:
            logger.info("worker %s takes work again", self.frontend.worker_id)
            return worker_pb2.WorkerDrainResponse()
        requeued = await self.frontend.hand_back_waiting()
        logger.info("worker %s draining: handed back %d waiting requests", self.frontend.worker_id, requeued)
        return worker_pb2.WorkerDrainResponse(requeued=requeued)

    async def Stats(  # noqa: N802
        self, request: worker_pb2.WorkerStatsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.WorkerStats:
        return self.heartbeat.snapshot()
