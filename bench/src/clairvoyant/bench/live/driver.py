"""The live load driver: workflow programs -> OpenAI requests to a running gateway -> ``RunRecords``.

    arrival ──> roots ready ──completions.create(stream)──> gateway ──> scheduler ──> worker
                   ^                                                                  │
                   └─── dependents ready after the tool latency (x time_scale) <── reply ┘

Each workflow is a set of asyncio tasks, one per call; a call waits for its dependencies (and
their tools), sends one streamed ``/v1/completions`` request through the official ``openai`` SDK,
and records what the client sees.  ``max_tokens`` plus ``ignore_eos`` make every output length
exact; ``app_metadata`` (workflow type, workflow id, agent id, parent request ids, upstream agent,
and ``workflow_end`` on a workflow's only sink) rides in ``extra_body``.  With ``session_header``
the workflow id also rides in that header (what a session-affinity router keys on), and with
``served_model`` every call names that one model instead of the workload's own.

What each ``CallResult`` field means live (times are seconds since the run started):

- ``ready_time``: the request was sent (its dependencies and their tools were done);
- ``first_token_time`` / ``end_time``: the first text chunk / the end of the stream arrived;
- ``start_time``: an estimate, the first token's arrival less the roofline's batch-1 prefill
  time of the uncached part of the prompt (the client cannot see the engine's first step), so
  ``queue_s`` is global + local queueing + the request's hops, less nothing of the prefill;
- ``dispatch_time`` and ``worker_id``: unknown to a client, left unset;
- ``prompt_tokens``, ``cached_tokens``, ``generated_tokens``: the worker's counts from ``usage``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import openai

from clairvoyant.bench.live.cluster import LiveModeError
from clairvoyant.bench.live.prompts import TextPrompts
from clairvoyant.bench.records import CallResult, RunRecords, WorkflowRecord
from clairvoyant.bench.sim.lower_bound import ServiceTime, lower_bound
from clairvoyant.workloads.program import Call, WorkflowProgram

MAX_PARENTS = 64  # the gateway's limit on app_metadata.parent_request_ids


def scale_tools(program: WorkflowProgram, factor: float) -> WorkflowProgram:
    """The same program with every tool latency multiplied by ``factor`` (``--time-scale``)."""
    if factor == 1.0:
        return program
    calls = tuple(replace(c, tool_latency_s=c.tool_latency_s * factor) for c in program.calls)
    return WorkflowProgram(program.workflow_type, program.workflow_id, calls)


def cap_output(program: WorkflowProgram, max_tokens: int | None) -> WorkflowProgram:
    """The same program with no call generating more than ``max_tokens`` (None: unchanged)."""
    if max_tokens is None:
        return program
    calls = tuple(replace(c, output_tokens=min(c.output_tokens, max_tokens)) for c in program.calls)
    return WorkflowProgram(program.workflow_type, program.workflow_id, calls)


def _sole_sink(program: WorkflowProgram) -> str | None:
    sinks = [call_id for call_id, children in program.dependents().items() if not children]
    return sinks[0] if len(sinks) == 1 else None


class LiveDriver:
    """Runs workflow programs against a gateway; one instance per run."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        service_times: Mapping[str, ServiceTime],
        *,
        seed: int = 0,
        run_tag: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        on_workflow_done: Callable[[WorkflowRecord], None] | None = None,
        model_clients: Mapping[str, openai.AsyncOpenAI] | None = None,
        session_header: str | None = None,
        served_model: str | None = None,
    ) -> None:
        """``run_tag`` is appended to each ``app_metadata.workflow_id`` (``wf-00003@<tag>``) so that
        two runs of one instance are two sets of workflows to the profiler.  ``model_clients``: a
        call of a model listed there goes to that client instead (e.g. one router per model).
        ``session_header``: a header that carries the workflow id; ``served_model``: the model
        every call names (one served model standing in for all of the workload's)."""
        self.client = client
        self.model_clients = dict(model_clients or {})
        self.session_header = session_header
        self.served_model = served_model
        self.service_times = dict(service_times)
        self.prompts = TextPrompts(seed)
        self.run_tag = run_tag
        self._clock = clock
        self._sleep = sleep
        self._on_workflow_done = on_workflow_done
        self._t0 = 0.0
        self.records = RunRecords()
        self.prompt_length_mismatches = 0  # calls whose worker-counted prompt differs from the program's
        self.calls_without_usage = 0  # calls whose server reported no usage (tokens = text chunks)

    def now(self) -> float:
        return self._clock() - self._t0

    async def run(
        self, arrivals: Sequence[tuple[float, WorkflowProgram]], backlog: Sequence[WorkflowProgram] = ()
    ) -> RunRecords:
        """Run to completion.  Closed loop: a workflow that ends starts the next one of ``backlog``
        at once (``arrivals`` are the initial ones).  Raises LiveModeError on a failed request."""
        self._t0 = self._clock()
        pending = list(reversed(backlog))

        async def slot(at: float, program: WorkflowProgram) -> None:
            await self._sleep(max(0.0, at - self.now()))
            await self._workflow(program)
            while pending:
                await self._workflow(pending.pop())

        try:
            async with asyncio.TaskGroup() as group:
                for at, program in arrivals:
                    group.create_task(slot(at, program))
        except BaseExceptionGroup as group_error:
            raise _first_error(group_error) from None
        records = self.records
        records.workflows.sort(key=lambda w: (w.arrival_time, w.workflow_id))
        records.calls.sort(key=lambda c: (c.ready_time, c.call_id))
        first = min((w.arrival_time for w in records.workflows), default=0.0)
        records.duration_s = max((w.end_time or 0.0 for w in records.workflows), default=0.0) - first
        return records

    async def _workflow(self, program: WorkflowProgram) -> None:
        bound = lower_bound(program, self.service_times) if self.service_times else 0.0
        record = WorkflowRecord(program.workflow_id, program.workflow_type, self.now(), len(program.calls), lower_bound_s=bound)
        self.records.workflows.append(record)
        done = {c.call_id: asyncio.Event() for c in program.calls}
        request_ids: dict[str, str] = {}
        sink = _sole_sink(program)

        async def run_call(call: Call) -> None:
            for dep in call.dependencies:
                await done[dep].wait()
            request_ids[call.call_id] = await self._call(program, call, request_ids, call.call_id == sink)
            await self._sleep(call.tool_latency_s)
            done[call.call_id].set()

        async with asyncio.TaskGroup() as group:
            for call in program.calls:
                group.create_task(run_call(call))
        record.end_time = self.now()  # the last call and the tool after it are done
        self.prompts.forget([c.call_id for c in program.calls])
        if self._on_workflow_done is not None:
            self._on_workflow_done(record)

    def _workflow_id(self, program: WorkflowProgram) -> str:
        return f"{program.workflow_id}@{self.run_tag}" if self.run_tag else program.workflow_id

    def _metadata(self, program: WorkflowProgram, call: Call, request_ids: Mapping[str, str], last: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "workflow_type_id": program.workflow_type,
            "workflow_id": self._workflow_id(program),
            "agent_id": call.agent_id,
        }
        parents = [request_ids[d] for d in call.dependencies if request_ids.get(d)]
        if parents:
            meta["parent_request_ids"] = parents[:MAX_PARENTS]
            meta["upstream_agent_id"] = program.call(call.dependencies[0]).agent_id
        if last:
            meta["workflow_end"] = True
        return meta

    async def _call(self, program: WorkflowProgram, call: Call, request_ids: Mapping[str, str], last: bool) -> str:
        """Send one call and record it; returns the gateway's request id."""
        text = self.prompts.prompt(program.workflow_type, call)
        record = CallResult(
            call.call_id, program.workflow_id, program.workflow_type, call.agent_id, call.model,
            call.prompt_tokens, call.output_tokens, self.now(), call.tool_latency_s,
        )  # fmt: skip
        self.records.calls.append(record)
        pieces: list[str] = []  # one per text chunk
        response_id = ""
        usage = None
        client = self.model_clients.get(call.model, self.client)
        headers = {self.session_header: self._workflow_id(program)} if self.session_header else None
        try:
            stream = await client.completions.create(
                model=self.served_model or call.model,
                prompt=text,
                max_tokens=call.output_tokens,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True, "app_metadata": self._metadata(program, call, request_ids, last)},
                extra_headers=headers,
            )
            async for chunk in stream:
                response_id = chunk.id or response_id
                if chunk.choices and chunk.choices[0].text:
                    if record.first_token_time is None:
                        record.first_token_time = self.now()
                    pieces.append(chunk.choices[0].text)
                if chunk.usage is not None:
                    usage = chunk.usage
        except openai.APIConnectionError as exc:
            raise LiveModeError(f"{call.call_id}: lost the server at {client.base_url} ({exc.__cause__ or exc})") from None
        except openai.APIError as exc:
            raise LiveModeError(f"{call.call_id}: the server at {client.base_url} answered {exc.message}") from None
        record.end_time = self.now()
        if usage is not None:
            self.prompt_length_mismatches += usage.prompt_tokens != call.prompt_tokens
            record.prompt_tokens = usage.prompt_tokens
            record.generated_tokens = usage.completion_tokens
            details = usage.prompt_tokens_details
            record.cached_tokens = (details.cached_tokens or 0) if details is not None else 0
        else:  # a server that reports no usage: one token per text chunk, as streams go
            self.calls_without_usage += 1
            record.generated_tokens = len(pieces)
        if record.first_token_time is None:
            record.first_token_time = record.end_time
        record.start_time = max(record.ready_time, record.first_token_time - self._prefill_s(call, record))
        text_out = "".join(pieces)
        self.prompts.record_response(call.call_id, text_out)
        return response_id.removeprefix("cmpl-")

    def _prefill_s(self, call: Call, record: CallResult) -> float:
        service = self.service_times.get(call.model)
        if service is None:
            return 0.0
        fresh = max(1, record.prompt_tokens - record.cached_tokens)
        return service.call_seconds(fresh, record.cached_tokens, 1)


def _first_error(group_error: BaseExceptionGroup) -> BaseException:
    """The LiveModeError inside (nested) task-group errors, else the first error."""
    for error in group_error.exceptions:
        if isinstance(error, BaseExceptionGroup):
            error = _first_error(error)
        if isinstance(error, LiveModeError):
            return error
    first = group_error.exceptions[0]
    return _first_error(first) if isinstance(first, BaseExceptionGroup) else first
