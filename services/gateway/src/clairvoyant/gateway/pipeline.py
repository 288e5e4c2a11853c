"""The request path shared by the HTTP and gRPC edges.

    resolve model -> annotate (optional profiler) -> Scheduler.Schedule (waits in the global queue)
      -> Worker.Generate (first message in) -> stream deltas -> Scheduler.Complete + CompletionRecord

A request for a model group (``models.py``) sends its input text along to the scheduler, which
picks the served model; from the placement on, the request is the served model's: Generate, the
answer's ``model``, and the CompletionRecord all name the model that ran it.

``start`` either raises a ``ClairvoyantError`` -- the request was refused, no state changed and
nothing is published -- or returns a ``Generation`` that the edge streams from and closes.  A
worker that is UNAVAILABLE before its first message gets the request re-placed once, elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, worker_pb2
from clairvoyant.core.bus import COMPLETIONS_SUBJECT
from clairvoyant.core.context_window import check_context_window
from clairvoyant.core.errors import (
    ClairvoyantError,
    InvalidRequest,
    ModelNotFound,
    NoWorkers,
    QueueFull,
    Unavailable,
)
from clairvoyant.core.model_groups import INPUT_TEXT_MAX_CHARS
from clairvoyant.core.telemetry import tracer
from clairvoyant.gateway import metrics
from clairvoyant.gateway.clients import AnnotateClient, NoAnnotator, SchedulerClient, WorkerPool
from clairvoyant.gateway.generation import Generation
from clairvoyant.gateway.leases import HeldPlacements
from clairvoyant.gateway.messages import encode_messages, placed_generate_request
from clairvoyant.gateway.models import ModelCatalog, ServedGroup, ServedModel
from clairvoyant.gateway.records import STATUS_CANCELLED, STATUS_ERROR, Outcome, build_record
from clairvoyant.gateway.releases import Release, ReleaseRetries
from clairvoyant.gateway.request import CompletionResult, GenerationRequest

logger = logging.getLogger(__name__)
_tracer = tracer(__name__)

# The scheduler's answers that mean it placed nothing.
_REFUSALS = (QueueFull, NoWorkers, InvalidRequest, ModelNotFound)


class RecordSink(Protocol):
    """Where CompletionRecords go (core.bus.EventBus); True when acknowledged at once."""

    async def publish_durable(self, subject: str, data: bytes) -> bool: ...


class Pipeline:
    def __init__(
        self,
        scheduler: SchedulerClient,
        workers: WorkerPool,
        models: ModelCatalog,
        records: RecordSink,
        annotator: AnnotateClient | None = None,
        default_max_tokens: int = 256,
        now: Callable[[], float] = time.time,
        held: HeldPlacements | None = None,
        record_token_ids: bool = True,
        release_retries: ReleaseRetries | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.workers = workers
        self.models = models
        self.records = records
        self.annotator = annotator or NoAnnotator()
        self.default_max_tokens = default_max_tokens
        self.now = now  # wall clock: CompletionRecord timings are seconds since the epoch
        # Placements from Schedule until Complete, renewed; and the releases whose first attempt
        # failed.  ``is None``, not ``or``: both are falsy while empty.
        self.held = HeldPlacements() if held is None else held
        self.release_retries = ReleaseRetries(scheduler) if release_retries is None else release_retries
        self.record_token_ids = record_token_ids  # CompletionRecords carry prompt and output token ids
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(
        self, request: GenerationRequest, parent: otel_context.Context | None = None
    ) -> Generation:
        metrics.IN_FLIGHT.inc()
        span = _tracer.start_span("gateway.request", context=parent, attributes=_span_attributes(request))
        try:
            with trace.use_span(span, end_on_exit=False):
                generation = await self._place_and_open(request, span)
        except BaseException as exc:
            metrics.IN_FLIGHT.dec()
            if isinstance(exc, ClairvoyantError):
                span.set_attribute("cv.error_code", exc.code)
                span.set_status(trace.Status(trace.StatusCode.ERROR, exc.message))
            span.end()
            raise
        generation.owns_request = True
        return generation

    async def complete(
        self, request: GenerationRequest, parent: otel_context.Context | None = None
    ) -> CompletionResult:
        """The whole answer at once (non-streaming requests)."""
        generation = await self.start(request, parent)
        try:
            await generation.complete()
        finally:
            await generation.close()
        return generation.result()

    async def _place_and_open(self, request: GenerationRequest, request_span: trace.Span) -> Generation:
        model = await self.models.resolve(request.model)
        estimate = request.estimated_prompt_tokens()
        request = replace(
            request, sampling=replace(request.sampling, max_tokens=self._max_tokens(request, model, estimate))
        )
        annotations = await self.annotator.annotate(request, estimate)
        input_text = request.input_text()[:INPUT_TEXT_MAX_CHARS] if isinstance(model, ServedGroup) else ""
        # Both messages are encoded while nothing is held: input that cannot go on the wire is
        # refused here, never after a placement exists.
        schedule_msg, generate_msg = encode_messages(
            request, annotations, estimate, self.held.owner, input_text=input_text
        )
        excluded: list[str] = []
        while True:
            del schedule_msg.exclude_workers[:]
            schedule_msg.exclude_workers.extend(excluded)
            placement = await self._schedule(schedule_msg)
            # From here until a Generation owns the placement, any failure must release it.
            self.held.hold(request.request_id, placement.lease_s)
            try:
                generation = self._attempt(request, placement, annotations, generate_msg, request_span)
            except BaseException:
                self.spawn(self.release(request.request_id, placement.worker_id, STATUS_ERROR))
                raise
            try:
                await generation.open()
            except Unavailable:
                await self.workers.forget_if_broken(placement.worker_address)
                if excluded:  # the second worker failed too: an accepted request the system failed
                    await generation.close()
                    raise
                logger.warning(
                    "worker %s unavailable for %s; re-placing", placement.worker_id, request.request_id
                )
                generation.discard()
                await generation.close()
                excluded.append(placement.worker_id)
                metrics.RETRIES.inc()
                continue
            except ClairvoyantError as err:
                if err.http_status < 500:  # the worker refused the input (e.g. context length)
                    generation.discard()
                await generation.close()
                raise
            except BaseException:  # cancelled during prefill: a CANCELLED record
                await generation.close()
                raise
            return generation

    def _attempt(
        self,
        request: GenerationRequest,
        placement: scheduler_pb2.Placement,
        annotations: common_pb2.SysAnnotations | None,
        generate_msg: worker_pb2.GenerateRequest,
        request_span: trace.Span,
    ) -> Generation:
        """Open the Generate call on the placed worker; the Generation owns the placement, and
        answers as the model that runs the call (a model group's call: the one the scheduler chose)."""
        msg = placed_generate_request(generate_msg, placement)
        if msg.model != request.model:
            request = replace(request, model=msg.model)
        scheduled_time = self.now()
        attempt_span = _tracer.start_span(
            "gateway.generate", attributes={"cv.worker_id": placement.worker_id, "cv.served_model": msg.model}
        )
        with trace.use_span(attempt_span, end_on_exit=False):  # the worker's span joins this trace
            call = self.workers.generate(placement.worker_address, msg)
        return Generation(
            self, request, placement, call, annotations, scheduled_time, request_span, attempt_span
        )

    async def release(
        self, request_id: str, worker_id: str, status: common_pb2.RequestStatus, output_tokens: int = 0
    ) -> None:
        """Give the placement back; ``output_tokens`` feed the scheduler's traffic counters.  Never
        raises, and returns after one attempt: one that fails is retried in the background
        (``ReleaseRetries``), and what that cannot release the scheduler reclaims when the lease,
        no longer renewed from here on, runs out."""
        self.held.drop(request_id)
        if not await self.scheduler.complete(request_id, worker_id, status, output_tokens):
            self.release_retries.retry(Release(request_id, worker_id, status, output_tokens))

    def _max_tokens(
        self, request: GenerationRequest, model: ServedModel | ServedGroup, prompt_estimate: int
    ) -> int:
        asked = request.sampling.max_tokens
        if asked is None:  # the default must not push a short model past its context window
            room = model.max_model_len - prompt_estimate if model.max_model_len else self.default_max_tokens
            return max(1, min(self.default_max_tokens, room))
        # The prompt is not tokenized here: the worker checks the window again with its exact length.
        check_context_window(model.max_model_len, asked, param="max_tokens")
        return asked

    async def _schedule(self, msg: scheduler_pb2.ScheduleRequest) -> scheduler_pb2.Placement:
        # Exceptions are not recorded on this span: a refusal is an answer, and formatting its
        # traceback was the largest cost of a 429 in an overload burst.
        with _tracer.start_as_current_span(
            "gateway.schedule", record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                placement = await self.scheduler.schedule(msg)
            except BaseException as exc:
                if isinstance(exc, ClairvoyantError):
                    span.set_attribute("cv.error_code", exc.code)
                if not isinstance(exc, _REFUSALS):
                    # Cancelled, timed out or cut off: the scheduler may have placed it all the same,
                    # so release whatever it holds (a no-op when it holds nothing).
                    self.spawn(self.release(msg.request_id, "", STATUS_CANCELLED))
                raise
            span.set_attribute("cv.worker_id", placement.worker_id)
            span.set_attribute("cv.queue_wait_s", placement.queue_wait_s)
        return placement

    async def publish(self, request: GenerationRequest, outcome: Outcome) -> None:
        record = build_record(request, outcome, token_ids=self.record_token_ids)
        acked = await self.records.publish_durable(COMPLETIONS_SUBJECT, record.SerializeToString())
        status = common_pb2.RequestStatus.Name(outcome.status)
        metrics.RECORDS.labels(status, "acked" if acked else "outbox").inc()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``coro`` beyond the caller's cancellation; ``aclose`` waits for it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Wait for pending releases and records (at shutdown), then for the releases being retried."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        await self.release_retries.aclose(timeout_s)


def _span_attributes(request: GenerationRequest) -> dict[str, str | bool]:
    attributes: dict[str, str | bool] = {
        "cv.request_id": request.request_id,
        "cv.tenant": request.tenant,
        "cv.model": request.model,
        "cv.endpoint": request.endpoint,
        "cv.stream": request.stream,
    }
    if request.app_metadata is not None:
        attributes["cv.workflow_id"] = request.app_metadata.workflow_id
        attributes["cv.agent_id"] = request.app_metadata.agent_id
    return attributes
