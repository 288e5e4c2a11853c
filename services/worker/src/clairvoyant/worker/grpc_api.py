"""The Worker gRPC service: a thin adapter from protobuf to ``WorkerFrontend``."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from clairvoyant.contracts.v1 import common_pb2, worker_pb2, worker_pb2_grpc
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.grpc_errors import abort
from clairvoyant.core.structured import ToolChoice
from clairvoyant.core.telemetry import extract_context, tracer
from clairvoyant.core.wire import (
    constraint_from_proto,
    tool_call_from_proto,
    tool_choice_from_proto,
    tool_from_proto,
)
from clairvoyant.worker.block_hashes import SequenceHasher
from clairvoyant.worker.core.kv_transfer import KvTransferError
from clairvoyant.worker.core.sampling import SamplingParams, TokenLogprob
from clairvoyant.worker.core.sequence import Lineage
from clairvoyant.worker.core.types import RequestOutput
from clairvoyant.worker.directives import DirectiveRejected
from clairvoyant.worker.frontend import Frontend, PromptInput, WorkerFrontend
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.kv_wire import PrefixAssembler
from clairvoyant.worker.metrics import DIRECTIVES
from clairvoyant.worker.runners.tokenizer import template_source
from clairvoyant.worker.tools import (
    ToolCallParser,
    ToolFormat,
    chat_turn,
    format_for_template,
    tool_constraint,
)

logger = logging.getLogger(__name__)
_tracer = tracer(__name__)


def prompt_input(msg: worker_pb2.GenerateRequest | worker_pb2.PrefillRequest) -> PromptInput:
    """The prompt as the frontend takes it; a chat's turns as chat templates read them (OpenAI's
    message shape: an assistant turn's ``tool_calls``, a tool turn's ``tool_call_id``), with the
    request's tools as OpenAI tool dicts."""
    kind = msg.WhichOneof("input")
    if kind == "chat":
        tools = [tool_from_proto(t).openai() for t in msg.tools] if isinstance(msg, worker_pb2.GenerateRequest) else []
        return PromptInput(messages=[chat_message(m) for m in msg.chat.messages], tools=tools or None)
    if kind == "prompt":
        return PromptInput(text=msg.prompt)
    if kind == "token_ids":
        return PromptInput(token_ids=list(msg.token_ids.ids))
    raise InvalidRequest("one of chat, prompt or token_ids is required", param="input")


def chat_message(msg: common_pb2.ChatMessage) -> dict[str, Any]:
    """One turn as templates read it (``tools.chat_turn``)."""
    calls = [tool_call_from_proto(call) for call in msg.tool_calls]
    return chat_turn(msg.role, msg.content, calls, msg.tool_call_id if msg.HasField("tool_call_id") else None)


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


@dataclass
class _Choice:
    """One choice's progress through the stream."""

    parser: ToolCallParser | None  # None: the request's calls are not parsed
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    completion_tokens: int = 0


class _Stream:
    """Turns the engine's outputs of one request (all its choices, interleaved) into replies:
    each choice's text through its own tool-call parser, ``finish_reason`` on each choice's last
    reply, and what counts the whole request once every choice has finished."""

    def __init__(self, request_id: str, n: int, new_parser: Callable[[], ToolCallParser] | None) -> None:
        self.request_id = request_id
        self.choices = [_Choice(new_parser() if new_parser else None) for _ in range(n)]
        self.awaiting_first_token = True
        self.prompt_tokens = 0
        self.cached_tokens = 0

    @property
    def all_finished(self) -> bool:
        return all(choice.finished for choice in self.choices)

    def reply(self, out: RequestOutput) -> worker_pb2.GenerateResponse:
        choice = self.choices[out.index]
        choice.output_ids.extend(out.new_token_ids)
        reply = worker_pb2.GenerateResponse(request_id=self.request_id, token_ids=out.new_token_ids, index=out.index)
        text = out.new_text
        if choice.parser is not None:
            parsed = choice.parser.feed(text)
            text, calls = parsed.text, list(parsed.calls)
            if out.finished:
                rest = choice.parser.finish()
                text, calls = text + rest.text, calls + list(rest.calls)
            reply.tool_calls.extend(
                common_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments) for c in calls
            )
        reply.text = text
        if self.awaiting_first_token:
            reply.prompt_tokens = out.prompt_tokens
            self.awaiting_first_token = not out.new_token_ids
        if out.finished:
            choice.finished = True
            choice.completion_tokens = out.completion_tokens
            made_calls = choice.parser is not None and choice.parser.calls_made > 0
            reply.finish_reason = out.finish_reason or "stop"
            if reply.finish_reason == "stop" and made_calls:
                reply.finish_reason = "tool_calls"
            if out.stop_sequence is not None:
                reply.stop_sequence = out.stop_sequence
            if out.index == 0:
                self.prompt_tokens, self.cached_tokens = out.prompt_tokens, out.cached_tokens
        return reply

    def usage(self) -> common_pb2.Usage:
        """The prompt once, every choice's completion tokens."""
        completion = sum(choice.completion_tokens for choice in self.choices)
        return common_pb2.Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
            cached_tokens=self.cached_tokens,
        )


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, frontend: Frontend, heartbeat: Heartbeat, *, tool_format: str = "") -> None:
        """``tool_format``: the tool-call format to use whatever the chat template (``tools.TOOL_FORMATS``);
        "" chooses it from the template."""
        self.frontend = frontend
        self.heartbeat = heartbeat
        self._tool_format = tool_format
        format_for_template(None, tool_format)  # an unknown name fails at start-up

    def tool_format(self) -> ToolFormat:
        """The call format (``tools.format_for_template``): from our runner's chat template; a peer
        engine's template is not ours to read (Hermes, unless the setting names one)."""
        template = None
        if isinstance(self.frontend, WorkerFrontend):
            template = template_source(self.frontend.runner.tokenizer)
        return format_for_template(template, self._tool_format)

    def _tools(
        self, request: worker_pb2.GenerateRequest, sampling: SamplingParams
    ) -> tuple[SamplingParams, Callable[[], ToolCallParser] | None]:
        """The sampling parameters with the tools' grammar, and how to parse each choice's calls
        (None: not parsed).  Raises InvalidRequest."""
        tools = [tool_from_proto(t) for t in request.tools]
        choice = tool_choice_from_proto(request.tool_choice) if request.HasField("tool_choice") else ToolChoice()
        if choice.mode == "none" or (not tools and choice.mode == "auto"):
            return sampling, None
        if tools and sampling.constraint is not None:
            raise InvalidRequest(
                "response_format cannot be combined with tools (unless tool_choice is none)", param="response_format"
            )
        fmt = self.tool_format()
        parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
        constraint = tool_constraint(fmt, tools, choice, parallel)
        return dataclasses.replace(sampling, constraint=constraint), lambda: ToolCallParser(fmt)

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
                sampling, new_parser = self._tools(request, sampling)
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
                engine_request.seat_limit = request.seat_limit
            except ClairvoyantError as err:
                await abort(context, err)
            except ValueError as exc:
                await abort(context, InvalidRequest(str(exc), param="sampling"))
            span.set_attribute("cv.prompt_tokens", len(ids))
            span.set_attribute("cv.base_priority", request.base_priority)
            span.set_attribute("cv.scheduler_preset", request.scheduler_preset)
            start = time.monotonic()
            hasher = SequenceHasher(ids)  # the prompt's chain, hashed while the engine prefills
            stream = _Stream(request_id, sampling.n, new_parser)
            try:
                async for out in self.frontend.run(engine_request):
                    reply = stream.reply(out)
                    if out.logprobs:
                        reply.logprobs.extend(logprobs_proto(out.logprobs, self.frontend.token_text))
                    if reply.HasField("prompt_tokens") and out.new_token_ids:  # the first token
                        span.add_event("first_token", {"cv.prefill_s": time.monotonic() - start})
                    if stream.all_finished:
                        reply.usage.CopyFrom(stream.usage())
                        prompt_hashes, response_hashes = await hasher.finish(stream.choices[0].output_ids)
                        reply.prompt_block_hashes.extend(prompt_hashes)
                        reply.response_block_hashes.extend(response_hashes)
                        reply.prompt_token_ids.extend(ids)  # the cache manager's workflow history
                        span.set_attribute("cv.completion_tokens", reply.usage.completion_tokens)
                        span.set_attribute("cv.cached_tokens", reply.usage.cached_tokens)
                    yield reply
            except ClairvoyantError as err:  # a drain handed it back (Unavailable), or the engine refused it
                if new_parser is not None and isinstance(err, InvalidRequest) and err.param == "response_format":
                    # The grammar that did not compile is the tools' (no response_format comes with them).
                    err = InvalidRequest(f"a tool's parameters schema: {err.message}", param="tools", code=err.code)
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
