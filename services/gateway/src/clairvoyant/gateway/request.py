"""The validated, transport-neutral form of a generation request, and what comes back.

The HTTP edge (pydantic) and the gRPC edge (protobuf) both produce a ``GenerationRequest``; the
pipeline never sees a transport type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import OutputConstraint, ToolCall, ToolChoice, ToolSpec
from clairvoyant.core.wire import constraint_to_proto

# The value of CompletionRecord.endpoint, and the label on the gateway's metrics.
Endpoint = Literal["chat.completions", "completions", "messages", "responses", "grpc"]


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None = None  # None until the pipeline applies its default for the model
    temperature: float | None = None  # None: the worker's default
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    logprobs: int | None = None  # None: none; k: each token's log probability and the top k
    constraint: OutputConstraint | None = None  # response_format and the guided_* extensions
    n: int = 1  # choices, sharing the prompt's prefill

    def to_proto(self) -> common_pb2.SamplingParams:
        msg = common_pb2.SamplingParams(
            stop=list(self.stop), ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            logit_bias=dict(self.logit_bias), n=self.n,
        )  # fmt: skip
        if self.constraint is not None:
            msg.constraint.CopyFrom(constraint_to_proto(self.constraint))
        if self.logprobs is not None:
            msg.logprobs = self.logprobs
        for name in ("frequency_penalty", "presence_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if value is not None:
                setattr(msg, name, value)
        if self.max_tokens is not None:
            msg.max_tokens = self.max_tokens
        if self.temperature is not None:
            msg.temperature = self.temperature
        if self.top_p is not None:
            msg.top_p = self.top_p
        if self.seed is not None:
            msg.seed = self.seed
        return msg


@dataclass(frozen=True)
class GenerationRequest:
    """Exactly one of ``chat`` and ``prompt`` is set."""

    request_id: str  # uuid hex; responses are named chatcmpl-<id> / cmpl-<id>
    tenant: str  # from the API key, never from the body
    endpoint: Endpoint
    model: str
    sampling: Sampling
    arrival_time: float  # wall clock, seconds since the epoch
    chat: tuple[ChatTurn, ...] | None = None
    prompt: str | None = None
    app_metadata: AppMetadata | None = None
    stream: bool = False
    echo_annotations: bool = False
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None  # None: "auto" when there are tools
    parallel_tool_calls: bool = True

    def __post_init__(self) -> None:
        assert (self.chat is None) != (self.prompt is None), "exactly one of chat and prompt"

    def prompt_chars(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(turn.content) for turn in self.chat or ())

    def input_text(self) -> str:
        """The workflow's input as a model-choosing scheduler reads it: the prompt, or the content of
        the last user message ("" when there is none)."""
        if self.prompt is not None:
            return self.prompt
        return next((turn.content for turn in reversed(self.chat or ()) if turn.role == "user"), "")

    def estimated_prompt_tokens(self) -> int:
        """A cheap guess for the scheduler (about four characters a token); the worker counts exactly."""
        turns = len(self.chat or ())
        return max(1, self.prompt_chars() // 4 + 4 * turns)


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_proto(cls, usage: common_pb2.Usage) -> TokenUsage:
        return cls(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)

    def to_proto(self) -> common_pb2.Usage:
        return common_pb2.Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.total_tokens,
            cached_tokens=self.cached_tokens,
        )


@dataclass(frozen=True)
class Choice:
    """One choice of a whole answer (``n`` > 1 gives several)."""

    index: int
    text: str
    finish_reason: str  # stop | length | tool_calls | abort
    logprobs: tuple[common_pb2.TokenLogprob, ...] | None = None  # None: not asked for
    stop_sequence: str | None = None  # the stop string that ended the output, if one did
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class CompletionResult:
    """A whole (non-streamed) answer.  ``text``, ``finish_reason``, ``logprobs``,
    ``stop_sequence`` and ``tool_calls`` are the first choice's; ``choices`` holds them all."""

    request_id: str
    model: str
    created: int  # seconds since the epoch, as OpenAI reports it
    text: str
    finish_reason: str
    usage: TokenUsage
    annotations: common_pb2.SysAnnotations | None = field(default=None)
    logprobs: tuple[common_pb2.TokenLogprob, ...] | None = None  # None: not asked for
    stop_sequence: str | None = None  # the stop string that ended the output, if one did
    tool_calls: tuple[ToolCall, ...] = ()
    choices: tuple[Choice, ...] = ()  # every choice, index order (the first one repeated above)
