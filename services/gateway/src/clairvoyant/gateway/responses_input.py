"""The Responses API's body fields read by hand, so that an error names where a value sits
(``input[2].content[0]``): input items as chat turns, function tools, the tool choice,
``text.format`` and ``metadata``, as OpenAI's API reference has them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import OutputConstraint, ToolCall, ToolChoice, ToolChoiceMode, ToolSpec

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's metadata limits


def invalid(param: str, message: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code=code)


def text_of(content: object, param: str, kinds: tuple[str, ...] = ("input_text", "output_text")) -> str:
    """A string, or the text of a list of ``input_text``/``output_text`` parts, joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of text parts", "invalid_type")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise invalid(
                f"{param}[{j}]",
                f"only {' and '.join(kinds)} parts ({{'type': ..., 'text': <string>}}) are supported, got {kind!r}",
                "unsupported_content",
            )
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid(f"{where}.{key}", "is required and must be a string", "invalid_type")
    return value


def input_turns(value: object, max_items: int) -> list[ChatTurn]:
    """``input`` as chat turns: a string is one user turn; in a list, consecutive ``function_call``
    items join the assistant turn before them, and a ``function_call_output`` is a tool turn
    (``named_results`` names it after its call)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [ChatTurn("user", value)]
    if not isinstance(value, list):
        raise invalid("input", "must be a string or a list of input items", "invalid_type")
    if len(value) > max_items:
        raise invalid(
            "input", f"has {len(value)} items; at most {max_items} are allowed", "array_above_max_length"
        )
    turns: list[ChatTurn] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an object", "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise invalid(f"{where}.role", "must be user, system, developer or assistant")
            content = text_of(item.get("content"), f"{where}.content")
            turns.append(ChatTurn("system" if role == "developer" else role, content))
        elif kind == "function_call":
            call = ToolCall(
                _string(item, "call_id", where),
                _string(item, "name", where),
                _string(item, "arguments", where),
            )
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant":
                turns[-1] = dataclasses.replace(last, tool_calls=(*last.tool_calls, call))
            else:
                turns.append(ChatTurn("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            output = text_of(item.get("output"), f"{where}.output", ("input_text",))
            turns.append(ChatTurn("tool", output, tool_call_id=call_id))
        else:
            raise invalid(
                f"{where}.type",
                f"input items of type {kind!r} are not supported; send message, function_call or "
                "function_call_output items",
                "unsupported_content",
            )
    return turns


def named_results(turns: Sequence[ChatTurn]) -> tuple[ChatTurn, ...]:
    """``turns`` with each unnamed tool result named after the function of the call it answers
    (chat templates render a result with its tool's name)."""
    names: dict[str, str] = {}  # call id -> function name
    named = []
    for turn in turns:
        names.update((call.id, call.name) for call in turn.tool_calls)
        if turn.role == "tool" and turn.name is None and turn.tool_call_id in names:
            turn = dataclasses.replace(turn, name=names[turn.tool_call_id])
        named.append(turn)
    return tuple(named)


def parse_tools(value: object) -> tuple[ToolSpec, ...]:
    """Function tools, flat as the Responses API has them; any other tool type is refused."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools", "must be a list of tools", "invalid_type")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(where, "must be an object", "invalid_type")
        kind = tool.get("type")
        if kind != "function":
            raise invalid(
                f"{where}.type", f"only function tools are supported, got {kind!r}", "unsupported_tool"
            )
        name = tool.get("name")
        if name is None and isinstance(tool.get("function"), dict):
            raise invalid(
                f"{where}.name",
                "is required: Responses API tools are flat ({type, name, description, parameters, strict}), "
                "not nested under 'function' as in chat completions",
                "missing_required_parameter",
            )
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            raise invalid(f"{where}.name", "must be 1 to 64 characters from a-z A-Z 0-9 _ -")
        if any(t.name == name for t in tools):
            raise invalid(f"{where}.name", f"a tool named {name!r} is already listed", "duplicate_tool")
        description, parameters, strict = tool.get("description"), tool.get("parameters"), tool.get("strict")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.description", "must be a string", "invalid_type")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid(f"{where}.parameters", "must be a JSON Schema object", "invalid_type")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{where}.strict", "must be a boolean", "invalid_type")
        tools.append(ToolSpec(name, description or "", parameters, True if strict is None else strict))
    return tuple(tools)


_MODES: dict[str, ToolChoiceMode] = {"auto": "auto", "none": "none", "required": "required"}


def parse_tool_choice(value: object, tools: Sequence[ToolSpec]) -> ToolChoice | None:
    if value is None:
        return None
    if isinstance(value, str) and value in _MODES:
        if value == "required" and not tools:
            raise invalid("tool_choice", "'required' needs at least one tool in tools")
        return ToolChoice(_MODES[value]) if tools else None
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not any(tool.name == name for tool in tools):
            raise invalid("tool_choice.name", f"names no function in tools: {name!r}")
        return ToolChoice("function", str(name))
    raise invalid(
        "tool_choice",
        "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        "unsupported_tool_choice",
    )


def parse_text_format(value: object) -> OutputConstraint | None:
    """``text.format``: ``text`` (no constraint), ``json_object``, or ``json_schema`` (the output
    is held to ``schema`` whether ``strict`` is set or not)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("text", "must be an object", "invalid_type")
    verbosity = value.get("verbosity")
    if verbosity not in (None, "medium"):
        raise invalid(
            "text.verbosity",
            "is not supported here; leave it unset or send 'medium'",
            "unsupported_parameter",
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        _string(fmt, "name", "text.format")
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise invalid(
                "text.format.schema", "is required and must be a JSON Schema object", "invalid_type"
            )
        return OutputConstraint.of_schema(schema)
    raise invalid("text.format.type", f"must be text, json_object or json_schema, got {kind!r}")


def check_metadata(metadata: Mapping[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid("metadata", f"holds at most {MAX_METADATA_PAIRS} pairs", "array_above_max_length")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise invalid(
                "metadata", f"keys are at most {MAX_METADATA_KEY} characters, values {MAX_METADATA_VALUE}"
            )
