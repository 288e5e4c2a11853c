"""Anthropic's messages read into chat turns (``chat_turns``): text, tool_use and tool_result
blocks, paired as Anthropic's API reference pairs them; InvalidRequest naming the first bad block.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import ToolCall
from clairvoyant.gateway.anthropic_content import BLOCK_SEPARATOR, TOOL_NAME_PATTERN, TOOL_USE_ID, MessageIn

ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it

T = TypeVar("T")


class Located(NamedTuple, Generic[T]):
    value: T
    param: str  # where the block sits, for errors


class ParsedMessage(NamedTuple):
    """One message's blocks, read but not yet paired with its neighbours."""

    role: str
    param: str  # messages[i]
    text: str | None  # its text blocks joined; None when it held tool blocks only
    calls: tuple[Located[ToolCall], ...] = ()  # assistant: its tool_use blocks
    results: tuple[Located[ChatTurn], ...] = ()  # user: its tool_result blocks, as tool turns


def parse_message(message: MessageIn, param: str) -> ParsedMessage:
    """A message's blocks: text anywhere, tool_use in an assistant message, tool_result in a user
    message before any text (as Anthropic requires).  InvalidRequest naming the first bad block."""
    content = message.content
    if not isinstance(content, list):
        return ParsedMessage(message.role, param, text_of(content, f"{param}.content"))
    allowed = {"user": "tool_result", "assistant": "tool_use"}.get(message.role)
    texts: list[str] = []
    calls: list[Located[ToolCall]] = []
    results: list[Located[ChatTurn]] = []
    for j, block in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == allowed == "tool_use":
            calls.append(Located(tool_use(block, where), where))
        elif kind == allowed == "tool_result":
            if texts:
                raise InvalidRequest(
                    f"{where}: tool_result blocks must come before any text in a message",
                    param=where,
                    code="invalid_value",
                )
            results.append(Located(tool_result(block, where), where))
        else:
            kinds = " or ".join(repr(k) for k in ("text", allowed) if k)
            raise InvalidRequest(
                f"{where} must be a {kinds} block in {_article(message.role)} message; got {kind!r}",
                param=where,
                code="unsupported_content",
            )
    text = BLOCK_SEPARATOR.join(texts) if texts or not (calls or results) else None
    return ParsedMessage(message.role, param, text, tuple(calls), tuple(results))


def _article(role: str) -> str:
    return f"an {role}" if role == "assistant" else f"a {role}"


def tool_use(block: dict[str, Any], where: str) -> ToolCall:
    """A tool_use block as a call; ``arguments`` is the JSON text of its ``input``."""
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not TOOL_USE_ID.match(call_id):
        raise _bad(f"{where}.id", "must be a string of A-Z a-z 0-9 _ - (toolu_...)")
    if not isinstance(name, str) or not re.match(TOOL_NAME_PATTERN, name):
        raise _bad(f"{where}.name", "must be a tool name of 1 to 128 characters from A-Z a-z 0-9 _ -")
    if not isinstance(arguments, dict):
        raise _bad(f"{where}.input", "must be an object")
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def tool_result(block: dict[str, Any], where: str) -> ChatTurn:
    """A tool_result block as a ``tool`` turn.  Chat templates have no error flag: an ``is_error``
    result reaches the model with ``ERROR_PREFIX`` before its text."""
    call_id, is_error = block.get("tool_use_id"), block.get("is_error")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id", "must be the id of a tool_use block")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error", "must be a boolean")
    content = block.get("content")
    text = "" if content is None else text_of(content, f"{where}.content")
    if is_error:
        text = ERROR_PREFIX + text if text else ERROR_PREFIX.rstrip(": ")
    return ChatTurn("tool", text, tool_call_id=call_id)


def _bad(param: str, rule: str) -> InvalidRequest:
    return InvalidRequest(f"{param} {rule}", param=param, code="invalid_value")


def chat_turns(messages: Sequence[ParsedMessage]) -> tuple[ChatTurn, ...]:
    """Parsed messages as chat turns.

    Consecutive messages of one role merge (Anthropic's API combines them): their texts joined by
    ``BLOCK_SEPARATOR``, their calls in order.  A user message's tool results become ``tool``
    turns, ahead of its text (a ``user`` turn).  As Anthropic requires, the message after an
    assistant message with tool_use blocks answers each of them with a tool_result, and a
    tool_result answers a call of the assistant message right before it; a tool_use id is used
    once.  InvalidRequest otherwise, and for a final assistant turn: Anthropic continues it
    (prefill), while the worker's chat template would start a new turn after it."""
    turns: list[ChatTurn] = []
    used_ids: set[str] = set()
    open_calls: dict[str, str] = {}  # the previous assistant group's calls: id -> tool name
    open_param = ""
    for group in _groups(messages):
        role = group[0].role
        answered = _answer(open_calls, group) if role == "user" else {}
        missing = [call_id for call_id in open_calls if call_id not in answered]
        if missing:
            raise InvalidRequest(
                f"{open_param}: tool_use ids were found without tool_result blocks right after: "
                f"{', '.join(missing)}; each tool_use needs a tool_result in the next message",
                param=open_param,
                code="invalid_value",
            )
        calls = [located for message in group for located in message.calls]
        for call, where in calls:
            if call.id in used_ids:
                raise _bad(f"{where}.id", f"repeats the id {call.id!r} of an earlier tool_use block")
            used_ids.add(call.id)
        open_calls = {call.id: call.name for call, _ in calls}
        open_param = group[-1].param
        turns.extend(
            dataclasses.replace(result, name=answered[result.tool_call_id or ""])
            for message in group
            for result, _ in message.results
        )
        texts = [message.text for message in group if message.text is not None]
        if texts or calls:
            turns.append(
                ChatTurn(role, BLOCK_SEPARATOR.join(texts), tool_calls=tuple(call for call, _ in calls))
            )
    if turns[-1].role == "assistant":
        param = messages[-1].param
        raise InvalidRequest(
            f"{param}: a final assistant message (prefill) is not supported; end with a user message",
            param=param,
            code="unsupported_prefill",
        )
    return tuple(turns)


def _groups(messages: Sequence[ParsedMessage]) -> list[list[ParsedMessage]]:
    groups: list[list[ParsedMessage]] = []
    for message in messages:
        if groups and groups[-1][0].role == message.role:
            groups[-1].append(message)
        else:
            groups.append([message])
    return groups


def _answer(open_calls: Mapping[str, str], group: Sequence[ParsedMessage]) -> dict[str, str]:
    """The calls a user group's tool results answer: id -> tool name.  InvalidRequest for a result
    that answers no call of the assistant message before it, or one already answered."""
    answered: dict[str, str] = {}
    for message in group:
        for result, where in message.results:
            call_id = result.tool_call_id or ""
            if call_id not in open_calls:
                raise _bad(
                    f"{where}.tool_use_id",
                    f"must answer a tool_use block of the assistant message right before it; {call_id!r} does not",
                )
            if call_id in answered:
                raise _bad(f"{where}.tool_use_id", f"answers {call_id!r} a second time")
            answered[call_id] = open_calls[call_id]
    return answered


def text_of(content: object, param: str) -> str:
    """A string, or the text of a list of ``{"type": "text", "text": ...}`` blocks (other keys, such
    as ``cache_control``, are ignored).  InvalidRequest naming the first block that is not text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(
            f"{param} must be a string or a list of text blocks", param=param, code="invalid_type"
        )
    texts = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(
                f"{where} must be {{'type': 'text', 'text': <string>}}; only text blocks are supported here, got {kind!r}",
                param=where,
                code="unsupported_content",
            )
        texts.append(block["text"])
    return BLOCK_SEPARATOR.join(texts)
