"""What one peer engine (vLLM, SGLang) looks like to the worker that fronts it.

An ``EngineAdapter`` knows one engine's command line, its HTTP API and its metrics; everything
else (the gRPC Worker contract, heartbeats, KV events on NATS, drain, directives) is shared, in
``engines/frontend.py`` and ``engines/app.py``.  An adapter never holds state about requests: the
frontend does.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import EngineStats, RequestOutput
from clairvoyant.worker.frontend import PromptInput

INT64_MAX = (1 << 63) - 1
# Our priorities are floats, larger = more urgent; the engines take integers.  Six decimals keep
# the order of every priority a preset computes (ages in seconds, 1/E[remaining], ranks).
PRIORITY_SCALE = 1_000_000


def openai_messages(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Chat turns as an OpenAI-compatible server validates them: a past call's ``arguments`` as JSON
    text.  The worker hands templates the arguments as an object (``tools.chat_turn``); vLLM's and
    SGLang's request schemas take a string and parse it for their templates themselves."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list) and calls:
            message = {**message, "tool_calls": [_string_arguments(call) for call in calls]}
        out.append(dict(message))
    return out


def _string_arguments(call: object) -> object:
    if not isinstance(call, dict):
        return call
    function = call.get("function")
    if not isinstance(function, dict) or isinstance(function.get("arguments"), str):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(function.get("arguments"))}}


def integer_priority(priority: float, *, lower_first: bool) -> int:
    """``priority`` (larger = more urgent) as an engine's integer priority: negated for an engine
    that serves lower values first (vLLM), clamped to int64."""
    value = round(priority * PRIORITY_SCALE)
    if lower_first:
        value = -value
    return max(-INT64_MAX, min(INT64_MAX, value))


@dataclass(frozen=True)
class LaunchSpec:
    """How the worker starts its engine (``WorkerSettings``, resolved)."""

    python: str
    model_path: str  # what the engine loads: an HF checkpoint directory or a hub id
    served_name: str  # the model id it serves (the worker's ``model``)
    host: str
    port: int
    max_num_seqs: int
    max_model_len: int | None
    kv_events_endpoint: str  # tcp://host:port, bound by the worker; the engine's publisher connects
    device: str  # "cpu" or "cuda"
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineCall:
    """One generation as the frontend hands it to an adapter."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: float  # larger = more urgent
    tenant: str  # the prefix-cache isolation key (a cache salt where the engine has one)


@dataclass
class Metrics:
    """An engine's Prometheus samples, summed over label sets per metric name; ``labels`` keeps
    each name's first label set (info gauges carry their values there)."""

    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)


def parse_metrics(text: str) -> Metrics:
    metrics = Metrics()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            metrics.values[sample.name] = metrics.values.get(sample.name, 0.0) + sample.value
            metrics.labels.setdefault(sample.name, dict(sample.labels))
    return metrics


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, object]]:
    """The JSON objects of a server-sent event stream (``data: {...}`` lines), until ``[DONE]``."""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


async def raise_for_engine(response: httpx.Response, engine: str) -> None:
    """An engine's 4xx is the caller's mistake (InvalidRequest, with the engine's message); any
    other failure is the engine's (Unavailable: the gateway places the request elsewhere)."""
    if response.status_code < 400:
        return
    body = (await response.aread()).decode(errors="replace")
    try:
        detail = json.loads(body)
        message = str(
            detail.get("error", {}).get("message") or detail.get("message") or detail.get("detail") or body
        )
    except (ValueError, AttributeError):
        message = body
    if 400 <= response.status_code < 500:
        raise InvalidRequest(f"{engine} refused the request: {message[:500]}", param="messages")
    raise Unavailable(f"{engine} answered {response.status_code}: {message[:500]}")


class EngineAdapter(ABC):
    """One engine's command line, HTTP API and metrics.  Subclasses are stateless."""

    name: str
    # Directive kinds the engine has no counterpart for: refused with FAILED_PRECONDITION and
    # listed in the worker's stats (``WorkerStats.unsupported_directives``).
    unsupported_directives: tuple[str, ...]
    health_path = "/health"

    @abstractmethod
    def launch_command(self, spec: LaunchSpec) -> list[str]:
        """The argv that starts the engine's server."""

    def launch_env(self, spec: LaunchSpec, kv_cache_mb: int) -> Mapping[str, str]:
        """Extra environment for the engine's process."""
        return {}

    @abstractmethod
    async def tokenize(self, client: httpx.AsyncClient, model: str, prompt: PromptInput) -> list[int]:
        """The prompt's token ids as the engine's tokenizer and chat template make them."""

    @abstractmethod
    def generate(
        self, client: httpx.AsyncClient, model: str, call: EngineCall
    ) -> AsyncIterator[RequestOutput]:
        """Stream the call's outputs; closing the iterator aborts the request in the engine."""

    @abstractmethod
    def stats(self, metrics: Metrics, max_num_seqs: int) -> EngineStats:
        """The worker's ``EngineStats`` from the engine's metrics."""

    @abstractmethod
    def block_size(self, metrics: Metrics) -> int | None:
        """The engine's KV block in tokens, from its metrics (None: not exported)."""

    @abstractmethod
    def max_model_len(self, served: Mapping[str, object]) -> int | None:
        """The context window from the engine's ``/v1/models`` entry for the served model."""


def stream_output(
    request_id: str,
    token_ids: Sequence[int],
    text: str,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    finish_reason: str | None = None,
) -> RequestOutput:
    """One incremental output; ``finish_reason`` set ends the stream."""
    reason = {"stop": "stop", "length": "length", "abort": "abort"}.get(finish_reason or "", "stop")
    return RequestOutput(
        request_id=request_id,
        new_token_ids=list(token_ids),
        new_text=text,
        finished=finish_reason is not None,
        finish_reason=reason if finish_reason is not None else None,  # type: ignore[arg-type]
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        first_token_time=None,
    )
