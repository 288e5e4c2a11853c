"""A response of the Responses API in OpenAI's shapes: its output items, usage and the echo of
what the request asked for (``response_shell``), and the assistant turn a later request in the
chain sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import ToolCall, new_call_id
from clairvoyant.gateway.request import CompletionResult, GenerationRequest, TokenUsage
from clairvoyant.gateway.responses_request import ParsedRequest

RESPONSE_PREFIX = "resp_"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = MessageItem | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int  # the whole prompt, cached tokens included (as OpenAI counts)
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: TokenUsage) -> ResponseUsage:
        return cls(
            input_tokens=usage.prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
        )


class ResponseOut(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    store: bool
    temperature: float | None
    text: dict[str, Any]
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None
    metadata: dict[str, str]


def response_id(request_id: str) -> str:
    return RESPONSE_PREFIX + request_id


def response_shell(parsed: ParsedRequest, request: GenerationRequest) -> ResponseOut:
    """The response before any output: what the request asked for, echoed as OpenAI echoes it."""
    body = parsed.body
    choice = parsed.tool_choice
    tool_choice: str | dict[str, Any] = (
        {"type": "function", "name": choice.name}
        if choice is not None and choice.mode == "function"
        else choice.mode
        if choice is not None
        else str(body.tool_choice or "auto")
    )
    tools = [
        {"type": "function", "name": t.name, "description": t.description or None, "parameters": t.parameters,
         "strict": t.strict}
        for t in parsed.tools
    ]  # fmt: skip
    text_format = body.text.get("format") if isinstance(body.text, dict) else None
    return ResponseOut(
        id=response_id(request.request_id),
        created_at=int(request.arrival_time),
        status="in_progress",
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=request.model,
        output=[],
        parallel_tool_calls=request.parallel_tool_calls,
        previous_response_id=body.previous_response_id,
        store=parsed.stores,
        temperature=body.temperature,
        text={"format": text_format or {"type": "text"}},
        tool_choice=tool_choice,
        tools=tools,
        top_p=body.top_p,
        user=body.user,
        metadata=dict(body.metadata or {}),
    )


def finished(
    shell: ResponseOut, output: list[OutputItem], finish_reason: str, usage: TokenUsage
) -> ResponseOut:
    """``shell`` with its output, status and usage: a generation cut at its token limit is
    ``incomplete`` (reason ``max_output_tokens``), as are its unfinished items."""
    incomplete = finish_reason == "length"
    return shell.model_copy(
        update={
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "output": output,
            "usage": ResponseUsage.of(usage),
        }
    )


def output_of(result: CompletionResult) -> list[OutputItem]:
    """The output items of a whole answer: its text as a message (left out when it is only
    whitespace beside tool calls), then one ``function_call`` item per call.  The token limit
    leaves the last item ``incomplete``, as a stream closes it."""
    rid = result.request_id
    items: list[OutputItem] = []
    if result.text.strip() or not result.tool_calls:
        items.append(
            MessageItem(id=f"msg_{rid}_0", status="completed", content=[OutputText(text=result.text)])
        )
    for call in result.tool_calls:
        index = len(items)
        items.append(
            FunctionCallItem(
                id=f"fc_{rid}_{index}", call_id=call.id or new_call_id(), name=call.name,
                arguments=call.arguments, status="completed",
            )
        )  # fmt: skip
    if result.finish_reason == "length":
        items[-1].status = "incomplete"
    return items


def assistant_turn(output: Sequence[OutputItem]) -> ChatTurn:
    """The output as the assistant turn a later request in the chain sees."""
    text = "".join(part.text for item in output if isinstance(item, MessageItem) for part in item.content)
    calls = tuple(
        ToolCall(item.call_id, item.name, item.arguments)
        for item in output
        if isinstance(item, FunctionCallItem)
    )
    return ChatTurn("assistant", text, tool_calls=calls)
