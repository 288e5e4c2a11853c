"""The answer of ``POST /v1/messages`` in Anthropic's shapes: the message and its content blocks,
its stop reason, and Anthropic's error object (``error_response``).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.core.structured import ToolCall, new_call_id
from clairvoyant.gateway.anthropic_content import BLOCK_SEPARATOR, TOOL_USE_ID
from clairvoyant.gateway.ratelimit import RateLimited
from clairvoyant.gateway.request import CompletionResult, TokenUsage

logger = logging.getLogger(__name__)


class TextBlockOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlockOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str  # toolu_...
    name: str
    input: dict[str, Any]


ContentBlockOut = Annotated[TextBlockOut | ToolUseBlockOut, Field(discriminator="type")]


class MessageUsage(BaseModel):
    input_tokens: int  # the prompt's tokens not read from the prefix cache
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int

    @classmethod
    def of(cls, usage: TokenUsage) -> MessageUsage:
        return cls(
            input_tokens=max(0, usage.prompt_tokens - usage.cached_tokens),
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=usage.cached_tokens,
        )


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlockOut]
    stop_reason: str | None
    stop_sequence: str | None = None  # the stop sequence that ended the answer, if one did
    usage: MessageUsage


class AnthropicError(BaseModel):
    type: str  # invalid_request_error, authentication_error, not_found_error, rate_limit_error, ...
    message: str


class AnthropicErrorOut(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicError


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def message_id(request_id: str) -> str:
    return f"msg_{request_id}"


def tool_use_id(call_id: str) -> str:
    """The tool_use id of a worker's call: ``call_<x>`` becomes ``toolu_<x>``.  Requests carry the
    client's ids to the worker as they are, so a round trip needs no mapping back.  A fresh id
    when the engine gave none, or one Anthropic's rule for ids would refuse."""
    if call_id.startswith("toolu_") and TOOL_USE_ID.match(call_id):
        return call_id
    suffix = call_id.removeprefix("call_")
    return "toolu_" + suffix if suffix and TOOL_USE_ID.match(suffix) else new_call_id("toolu_")


def tool_input(arguments: str) -> dict[str, Any] | None:
    """A call's arguments as a tool_use ``input``: the JSON object they spell ("" is ``{}``, a call
    without arguments), or None when they spell no object.  The worker's grammar always makes an
    object; an engine without one may not, and such a call is answered as text."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def stop_reason(finish_reason: str, stop_sequence: str | None = None, *, called: bool = True) -> str:
    """Anthropic's stop_reason for a worker's finish_reason: "stop" is ``stop_sequence`` when the
    worker names the stop string that matched, else end_turn; "tool_calls" is tool_use when the
    answer holds a tool_use block (``called``), else end_turn; "abort" passes through."""
    if finish_reason == "stop" and stop_sequence is not None:
        return "stop_sequence"
    if finish_reason == "tool_calls" and not called:
        return "end_turn"
    return _STOP_REASONS.get(finish_reason, finish_reason)


def content_blocks(text: str, calls: Sequence[ToolCall]) -> list[TextBlockOut | ToolUseBlockOut]:
    """The text block (when there is text, or nothing else), then a tool_use block per call.  A
    call whose arguments spell no JSON object joins the text as those arguments."""
    uses: list[TextBlockOut | ToolUseBlockOut] = []
    texts = [text] if text else []
    for call in calls:
        arguments = tool_input(call.arguments)
        if arguments is None:
            logger.warning("tool call %r has arguments that are no JSON object; answered as text", call.name)
            texts.append(call.arguments)
        else:
            uses.append(ToolUseBlockOut(id=tool_use_id(call.id), name=call.name, input=arguments))
    if texts or not uses:
        return [TextBlockOut(text=BLOCK_SEPARATOR.join(texts)), *uses]
    return uses


def message_out(result: CompletionResult) -> MessageOut:
    content = content_blocks(result.text, result.tool_calls)
    called = any(isinstance(block, ToolUseBlockOut) for block in content)
    return MessageOut(
        id=message_id(result.request_id),
        model=result.model,
        content=content,
        stop_reason=stop_reason(result.finish_reason, result.stop_sequence, called=called),
        stop_sequence=result.stop_sequence,
        usage=MessageUsage.of(result.usage),
    )


def error_out(err: ClairvoyantError) -> AnthropicErrorOut:
    """Anthropic's error type follows the HTTP status; other 4xx are invalid_request_error."""
    kind = _ERROR_TYPES.get(
        err.http_status, "invalid_request_error" if err.http_status < 500 else "api_error"
    )
    return AnthropicErrorOut(error=AnthropicError(type=kind, message=err.message))


def error_response(err: ClairvoyantError) -> JSONResponse:
    headers = {}
    if err.retry_after_s is not None or err.http_status == 429:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s or 1)))
    if isinstance(err, RateLimited):
        headers.update(err.headers)
    return JSONResponse(error_out(err).model_dump(), status_code=err.http_status, headers=headers)
