"""Tools, calls and results in the prompt: the message shape chat templates read, and Qwen2.5's
wording for templates that know only role and content."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clairvoyant.core.structured import ToolCall

HERMES_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
HERMES_TOOLS_CLOSING = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


def hermes_tools_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The tools section of Qwen2.5's system prompt, word for word as its template writes it."""
    listed = "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools)
    return HERMES_TOOLS_PREAMBLE + listed + HERMES_TOOLS_CLOSING


def hermes_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> list[dict[str, str]]:
    """Plain role/content messages that spell tools, calls and results as Qwen2.5 does, for a
    template that knows only role and content: the tools section ends the system prompt (a system
    turn is added when there is none), an assistant turn's calls follow its content as
    ``<tool_call>`` blocks, and consecutive tool results become one user turn of
    ``<tool_response>`` blocks."""
    out: list[dict[str, str]] = []
    if tools:
        section = hermes_tools_prompt(tools)
        if messages and messages[0].get("role") == "system":
            out.append({"role": "system", "content": f"{messages[0].get('content') or ''}\n\n{section}"})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": section})
    for message in messages:
        role, content = message.get("role", ""), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            blocks = [content] if content else []
            for call in message["tool_calls"]:
                function = call.get("function", call)
                arguments = function.get("arguments")
                blocks.append(
                    '<tool_call>\n{"name": "' + function["name"] + '", "arguments": '
                    + json.dumps(arguments, ensure_ascii=False) + "}\n</tool_call>"
                )  # fmt: skip
            out.append({"role": "assistant", "content": "\n".join(blocks)})
        elif role == "tool":
            block = "<tool_response>\n" + content + "\n</tool_response>"
            if out and out[-1].get("from_tool") == "1":
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "from_tool": "1"})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("from_tool", None)
    return out


def chat_turn(
    role: str, content: str, tool_calls: Sequence[ToolCall] = (), tool_call_id: str | None = None
) -> dict[str, Any]:
    """One turn as chat templates read it (OpenAI's message shape, as transformers passes it): an
    assistant turn's ``tool_calls`` with their arguments parsed (``chat_arguments``), a tool
    turn's ``tool_call_id``."""
    message: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": chat_arguments(c.arguments)}}
            for c in tool_calls
        ]
    if tool_call_id is not None:
        message["tool_call_id"] = tool_call_id
    return message


def chat_arguments(arguments: str) -> Any:
    """A past call's arguments as templates read them: the parsed JSON object (Qwen2.5's and
    Llama 3.1's templates apply ``tojson`` to them, which would quote a string again); text that
    is not a JSON object stays text."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments
