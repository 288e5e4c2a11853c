"""In-process stand-ins for the scheduler, a worker and the profiler: real grpc.aio servers.

They record what the gateway sent them, so tests can assert on calls (and on the absence of calls).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from clairvoyant.contracts.v1 import (
    common_pb2,
    profiler_pb2,
    profiler_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from clairvoyant.core.blockhash import sequence_hashes
from clairvoyant.core.errors import ClairvoyantError, ContextLengthExceeded, Unavailable
from clairvoyant.core.grpc_errors import abort

MODEL = "tiny-test-model"
TOKENS = ("Hello", ",", " world", "!")


@dataclass
class WorkerEntry:
    worker_id: str
    address: str
    model: str = MODEL
    max_model_len: int = 4096


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Places each request on the first listed worker it was not told to exclude."""

    def __init__(self) -> None:
        self.workers: list[WorkerEntry] = []
        self.reject: ClairvoyantError | None = None  # set to refuse every Schedule with this error
        self.schedule_calls: list[scheduler_pb2.ScheduleRequest] = []
        self.complete_calls: list[scheduler_pb2.CompleteRequest] = []
        self.schedule_metadata: list[dict[str, str]] = []

    async def Schedule(self, request, context):  # noqa: N802
        self.schedule_calls.append(request)
        self.schedule_metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        if self.reject is not None:
            await abort(context, self.reject)
        for worker in self.workers:
            if worker.model == request.model and worker.worker_id not in request.exclude_workers:
                return scheduler_pb2.Placement(
                    request_id=request.request_id,
                    worker_id=worker.worker_id,
                    worker_address=worker.address,
                    base_priority=1.5,
                    queue_wait_s=0.001,
                )
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"no worker serves {request.model}")

    async def Complete(self, request, context):  # noqa: N802
        self.complete_calls.append(request)
        return scheduler_pb2.CompleteResponse(released=True)

    async def Snapshot(self, request, context):  # noqa: N802
        return scheduler_pb2.SchedulerSnapshot(
            policy="fake",
            workers=[
                scheduler_pb2.WorkerState(
                    worker_id=w.worker_id, model=w.model, address=w.address, max_model_len=w.max_model_len
                )
                for w in self.workers
            ],
        )


def prompt_text(request: worker_pb2.GenerateRequest) -> str:
    if request.WhichOneof("input") == "chat":
        return "\n".join(m.content for m in request.chat.messages)
    return request.prompt


def fake_block_hashes(request: worker_pb2.GenerateRequest, num_tokens: int) -> tuple[list[int], list[int]]:
    """The chains FakeWorker reports: the prompt's bytes as token ids, then output ids 100, 101, ..."""
    return sequence_hashes(list(prompt_text(request).encode()), [100 + i for i in range(num_tokens)])


@dataclass
class FakeWorker(worker_pb2_grpc.WorkerServicer):
    """Streams ``tokens`` (at most max_tokens of them), one every ``delay_s``; the last message
    carries ``fake_block_hashes``.

    Refuses prompts longer than ``max_prompt_chars`` with INVALID_ARGUMENT/context_length_exceeded,
    as the real worker does, before sending anything.  Notes a cancelled call in ``cancelled``.
    """

    worker_id: str = "worker-1"
    tokens: tuple[str, ...] = TOKENS
    delay_s: float = 0.0
    max_prompt_chars: int = 1000
    fail_after: int | None = None  # abort with UNAVAILABLE after this many tokens (a worker dying)
    stop_sequence: str | None = None  # reported on the last message: a stop string ended the output
    calls: list[worker_pb2.GenerateRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    finished: int = 0

    async def Generate(self, request, context) -> AsyncIterator[worker_pb2.GenerateResponse]:  # noqa: N802
        self.calls.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        text = prompt_text(request)
        if len(text) > self.max_prompt_chars:
            await abort(
                context,
                ContextLengthExceeded(
                    f"the prompt is {len(text)} characters; this worker takes {self.max_prompt_chars}",
                    param="messages",
                ),
            )
        prompt_tokens = len(text.split())
        limit = request.sampling.max_tokens if request.sampling.HasField("max_tokens") else len(self.tokens)
        out = self.tokens[:limit]
        choices = max(1, request.sampling.n)  # n > 1: each piece once per choice, choices interleaved
        try:
            for i, piece in enumerate(out):
                if i == self.fail_after:
                    await abort(context, Unavailable("worker lost its device"))
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                for index in range(choices):
                    reply = worker_pb2.GenerateResponse(
                        request_id=request.request_id, text=piece, token_ids=[100 + i], index=index
                    )
                    if i == 0 and index == 0:
                        reply.prompt_tokens = prompt_tokens
                    if i == len(out) - 1:
                        reply.finish_reason = "length" if len(out) < len(self.tokens) else "stop"
                        if self.stop_sequence is not None and reply.finish_reason == "stop":
                            reply.stop_sequence = self.stop_sequence
                    if i == len(out) - 1 and index == choices - 1:  # the whole request's totals, once
                        reply.usage.CopyFrom(
                            common_pb2.Usage(
                                prompt_tokens=prompt_tokens,
                                completion_tokens=choices * len(out),
                                total_tokens=prompt_tokens + choices * len(out),
                                cached_tokens=prompt_tokens // 2,
                            )
                        )
                        prompt_hashes, response_hashes = fake_block_hashes(request, len(out))
                        reply.prompt_block_hashes.extend(prompt_hashes)
                        reply.response_block_hashes.extend(response_hashes)
                    yield reply
            self.finished += 1
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


ANNOTATIONS = common_pb2.SysAnnotations(
    predicted_output_len=common_pb2.LengthInterval(p50=10, p99=40), confidence=common_pb2.CONFIDENCE_HIGH
)


@dataclass
class FakeProfiler(profiler_pb2_grpc.ProfilerServicer):
    """Answers Annotate with fixed predictions, after ``delay_s`` (past the gateway's deadline: ignored)."""

    delay_s: float = 0.0
    calls: list[profiler_pb2.AnnotateRequest] = field(default_factory=list)

    async def Annotate(self, request, context):  # noqa: N802
        self.calls.append(request)
        await asyncio.sleep(self.delay_s)
        return profiler_pb2.AnnotateResponse(annotations=ANNOTATIONS)


async def start_server(*servicers: object) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    for servicer in servicers:
        if isinstance(servicer, FakeScheduler):
            scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, server)
        elif isinstance(servicer, FakeWorker):
            worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
        elif isinstance(servicer, FakeProfiler):
            profiler_pb2_grpc.add_ProfilerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"
