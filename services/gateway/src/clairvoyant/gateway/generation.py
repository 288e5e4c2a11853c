"""One accepted request: a placement on a worker and the open Generate stream from it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, NamedTuple, Protocol

import grpc
from opentelemetry import trace

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, worker_pb2
from clairvoyant.core.errors import ClairvoyantError, Unavailable
from clairvoyant.core.structured import assemble_calls
from clairvoyant.gateway import metrics
from clairvoyant.gateway.clients import GenerateCall, rpc_error
from clairvoyant.gateway.records import STATUS_CANCELLED, STATUS_ERROR, STATUS_OK, Outcome
from clairvoyant.gateway.request import Choice, CompletionResult, GenerationRequest, TokenUsage

logger = logging.getLogger(__name__)


class Piece(NamedTuple):
    """One worker message's share of one choice's output."""

    choice: int  # the choice's index
    text: str
    logprobs: Sequence[common_pb2.TokenLogprob]
    tool_calls: Sequence[common_pb2.ToolCallDelta]
    finish_reason: str | None  # set on the choice's last piece


class RequestLifecycle(Protocol):
    """What a ``Generation`` needs of the pipeline that started it (``Pipeline`` is one)."""

    now: Callable[[], float]  # wall clock, seconds since the epoch

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` beyond the caller's cancellation."""
        ...

    async def release(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> None:
        """Give the placement back; ``output_tokens``: what the call generated.  Never raises."""
        ...

    async def publish(self, request: GenerationRequest, outcome: Outcome) -> None:
        """Publish the request's CompletionRecord."""
        ...


class Generation:
    """Returned by ``Pipeline.start`` once the worker's first message is in (so every refusal of
    the request has already been raised).  Iterate ``deltas()`` once, then always ``close()``.

    ``close()`` is idempotent and safe to call from a cancelled task: it cancels the worker call
    at once (freeing the sequence's KV blocks) and finishes the rest -- releasing the placement
    and publishing the CompletionRecord -- in a task of its own that the cancellation cannot
    interrupt.  The record's status follows from how far the stream got: OK when the worker sent
    a finish_reason, ERROR when the system failed, CANCELLED when the caller stopped early.
    """

    def __init__(
        self,
        pipeline: RequestLifecycle,
        request: GenerationRequest,
        placement: scheduler_pb2.Placement,
        call: GenerateCall,
        annotations: common_pb2.SysAnnotations | None,
        scheduled_time: float,
        request_span: trace.Span,
        attempt_span: trace.Span,
    ) -> None:
        self.request = request
        self.placement = placement
        self.annotations = annotations
        self.created = int(request.arrival_time)
        # Set once every choice has finished: the first choice's reason (finish_reasons has all).
        self.finish_reason: str | None = None
        self.stop_sequence: str | None = None  # the first choice's stop string, if one ended it
        self.finish_reasons: dict[int, str] = {}  # choice index -> its finish_reason, as they finish
        self.stop_sequences: dict[int, str] = {}
        self.usage = TokenUsage()
        self._pipeline = pipeline
        self._call = call
        self._request_span = request_span
        self._attempt_span = attempt_span
        self._scheduled_time = scheduled_time
        self._first_token_time = 0.0
        self._pending: worker_pb2.GenerateResponse | None = None
        self._tokens_seen = 0
        self._prompt_tokens = 0
        self._prompt_block_hashes: tuple[int, ...] = ()
        self._response_block_hashes: tuple[int, ...] = ()
        self._prompt_token_ids: tuple[int, ...] = ()
        self._output_token_ids: list[int] = []
        self.logprobs: list[common_pb2.TokenLogprob] = []  # the first choice's so far (when asked for)
        self._texts: dict[int, list[str]] = {}  # choice index -> its text pieces (result() only)
        self._choice_logprobs: dict[int, list[common_pb2.TokenLogprob]] = {}
        self._tool_deltas: dict[int, list[common_pb2.ToolCallDelta]] = {}
        self._error: ClairvoyantError | None = None
        self._recorded = True  # False: release the placement but publish nothing
        # Set by Pipeline.start on success: from then on, closing this generation ends the request
        # (its span and in-flight count); before that, start ends the request itself.
        self.owns_request = False
        self._closing: asyncio.Future[None] | None = None

    @property
    def worker_id(self) -> str:
        return self.placement.worker_id

    async def open(self) -> None:
        """Wait for the worker's first message; a worker refuses a request (e.g. context length) before it."""
        msg = await self._read()
        if msg is None:
            self._error = Unavailable(f"worker {self.worker_id} closed the stream before answering")
            raise self._error
        self._pending = msg

    def discard(self) -> None:
        """Publish no record for this attempt: the input was refused, or the request is re-placed."""
        self._recorded = False

    async def deltas(self) -> AsyncIterator[str]:
        """The first choice's text piece by piece.  Raises ClairvoyantError if the worker fails mid-way."""
        async for text, _ in self.pieces():
            if text:
                yield text

    async def pieces(self) -> AsyncIterator[tuple[str, Sequence[common_pb2.TokenLogprob]]]:
        """The first choice's output piece by piece: new text and the new tokens' log probabilities
        (empty unless asked for); either may be empty.  Raises ClairvoyantError if the worker
        fails mid-way."""
        async for piece in self.chunks():
            if piece.choice == 0 and (piece.text or piece.logprobs):
                yield piece.text, piece.logprobs

    async def chunks(self) -> AsyncIterator[Piece]:
        """Every choice's output piece by piece, as the worker sends it: text, log probabilities
        and tool-call pieces, each tagged with its choice.  A piece whose ``finish_reason`` is set
        is its choice's last.  Raises ClairvoyantError if the worker fails mid-way."""
        msg, self._pending = self._pending, None
        while msg is not None:
            self._absorb(msg)
            finish = msg.finish_reason if msg.HasField("finish_reason") else None
            if msg.text or msg.logprobs or msg.tool_calls or finish is not None:
                yield Piece(msg.index, msg.text, msg.logprobs, msg.tool_calls, finish)
            if self.finish_reason is not None:
                return
            msg = await self._read()
        self._error = Unavailable(f"worker {self.worker_id} ended the stream without a finish_reason")
        raise self._error

    async def complete(self) -> CompletionResult:
        """Read the rest of the stream and return the whole answer, every choice."""
        async for _ in self.chunks():
            pass
        return self.result()

    def result(self, text: str | None = None) -> CompletionResult:
        """The whole answer, once the stream has been read to its end (``chunks`` or ``complete``).
        ``text``: the first choice's text as the caller assembled it (default: as absorbed)."""
        assert self.finish_reason is not None, "result() is for a generation that finished"
        wants_logprobs = self.request.sampling.logprobs is not None
        choices = tuple(
            Choice(
                index,
                "".join(self._texts.get(index, ())),
                self.finish_reasons[index],
                tuple(self._choice_logprobs.get(index, ())) if wants_logprobs else None,
                self.stop_sequences.get(index),
                assemble_calls(self._tool_deltas.get(index, ())),
            )
            for index in sorted(self.finish_reasons)
        )
        first = choices[0]
        return CompletionResult(
            self.request.request_id,
            self.request.model,
            self.created,
            first.text if text is None else text,
            first.finish_reason,
            self.usage,
            self.annotations,
            first.logprobs,
            first.stop_sequence,
            first.tool_calls,
            choices,
        )

    async def _read(self) -> worker_pb2.GenerateResponse | None:
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as err:
            self._error = rpc_error(err, f"worker {self.worker_id}")
            raise self._error from None
        return None if msg is grpc.aio.EOF else msg

    def _absorb(self, msg: worker_pb2.GenerateResponse) -> None:
        if msg.HasField("prompt_tokens"):
            self._prompt_tokens = msg.prompt_tokens
        if (msg.text or msg.token_ids) and not self._first_token_time:
            self._first_token_time = self._pipeline.now()
            metrics.TTFT.labels(self.request.endpoint).observe(
                self._first_token_time - self.request.arrival_time
            )
            self._attempt_span.add_event("first_token")
        self._tokens_seen += len(msg.token_ids)
        index = msg.index
        if index == 0:
            self._output_token_ids.extend(msg.token_ids)
            self.logprobs.extend(msg.logprobs)
        if msg.text:
            self._texts.setdefault(index, []).append(msg.text)
        if msg.logprobs:
            self._choice_logprobs.setdefault(index, []).extend(msg.logprobs)
        if msg.tool_calls:
            self._tool_deltas.setdefault(index, []).extend(msg.tool_calls)
        if msg.HasField("usage"):
            self.usage = TokenUsage.from_proto(msg.usage)
        else:
            self.usage = TokenUsage(self._prompt_tokens, self._tokens_seen, self.usage.cached_tokens)
        if msg.HasField("finish_reason"):
            self.finish_reasons[index] = msg.finish_reason or "stop"
            if msg.HasField("stop_sequence"):
                self.stop_sequences[index] = msg.stop_sequence
        if msg.HasField("finish_reason") and len(self.finish_reasons) >= max(1, self.request.sampling.n):
            self._attempt_span.add_event("last_message")  # the answer is whole: it can go out
            self.finish_reason = self.finish_reasons.get(0, "stop")
            self.stop_sequence = self.stop_sequences.get(0)
            self._prompt_block_hashes = tuple(msg.prompt_block_hashes)
            self._response_block_hashes = tuple(msg.response_block_hashes)
            self._prompt_token_ids = tuple(msg.prompt_token_ids)

    def _outcome(self) -> Outcome:
        if self._error is None and self.finish_reason is not None:
            status, reason, code = STATUS_OK, self.finish_reason, ""
        elif self._error is not None:
            status, reason, code = STATUS_ERROR, "error", self._error.code
        else:
            status, reason, code = STATUS_CANCELLED, "abort", "client_disconnected"
        return Outcome(
            status=status,
            worker_id=self.worker_id,
            usage=self.usage,
            scheduled_time=self._scheduled_time,
            first_token_time=self._first_token_time,
            end_time=self._pipeline.now(),
            finish_reason=reason,
            error_code=code,
            prompt_block_hashes=self._prompt_block_hashes,
            response_block_hashes=self._response_block_hashes,
            prompt_token_ids=self._prompt_token_ids,
            output_token_ids=tuple(self._output_token_ids),
            annotations=self.annotations,
        )

    async def close(self) -> None:
        """Release the placement and publish the record.

        A request that finished normally returns at once: releasing the placement and the
        JetStream ack (about 2 ms together) happen in a task the pipeline tracks, so they never
        delay the client's last byte.  Cancelled and failed requests wait for the release.
        """
        finished = self.finish_reason is not None and self._error is None
        if self._closing is None:
            if not finished:
                self._call.cancel()  # now, not in the task below: the worker frees the KV at once
            outcome = self._outcome()
            if self._recorded and outcome.status == STATUS_OK:
                metrics.E2E_LATENCY.labels(self.request.endpoint).observe(
                    outcome.end_time - self.request.arrival_time
                )
            metrics.OUTPUT_TOKENS.labels(self.request.model).inc(outcome.usage.completion_tokens)
            self._closing = self._pipeline.spawn(self._finish(finished, outcome))
        if not finished:
            await asyncio.shield(self._closing)

    async def _finish(self, finished: bool, outcome: Outcome) -> None:
        try:
            if finished:
                # Let the worker end the call itself; cancelling a finished sequence only adds noise.
                with contextlib.suppress(asyncio.TimeoutError, grpc.aio.AioRpcError):
                    await asyncio.wait_for(self._call.code(), timeout=1.0)
                self._call.cancel()
            await self._pipeline.release(
                self.request.request_id, self.worker_id, outcome.status, outcome.usage.completion_tokens
            )
            logger.info(
                "request %s %s",
                self.request.request_id,
                common_pb2.RequestStatus.Name(outcome.status),
                extra={
                    "tenant": self.request.tenant,
                    "model": self.request.model,
                    "worker_id": self.worker_id,
                    "endpoint": self.request.endpoint,
                    "prompt_tokens": outcome.usage.prompt_tokens,
                    "output_tokens": outcome.usage.completion_tokens,
                    "recorded": self._recorded,
                    "e2e_s": round(outcome.end_time - self.request.arrival_time, 4),
                },
            )
            if self._recorded:
                await self._pipeline.publish(self.request, outcome)
        except Exception:  # a bug here must not leak the in-flight count or the span
            logger.exception("finishing request %s failed", self.request.request_id)
        finally:
            spans = [self._attempt_span, self._request_span] if self.owns_request else [self._attempt_span]
            for span in spans:
                span.set_attribute("cv.status", common_pb2.RequestStatus.Name(outcome.status))
                span.set_attribute("cv.output_tokens", outcome.usage.completion_tokens)
                if self._error is not None:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, self._error.message))
                span.end()
            if self.owns_request:
                metrics.IN_FLIGHT.dec()
