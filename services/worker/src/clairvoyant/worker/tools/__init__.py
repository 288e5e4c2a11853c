"""Tool calling in the worker: the call format a model speaks (``formats``), the grammar that keeps
its calls well formed (``grammar``), the streaming parser that turns its text back into calls
(``parser``), and tools in the prompt (``render``).  docs/tools.md has the whole path."""

from clairvoyant.worker.tools.formats import (
    HERMES,
    LLAMA3_JSON,
    TOOL_FORMATS,
    ToolFormat,
    format_for_template,
)
from clairvoyant.worker.tools.grammar import MAX_WHITESPACE, openai_tool, tool_constraint
from clairvoyant.worker.tools.parser import CallDelta, Parsed, ToolCallParser
from clairvoyant.worker.tools.render import chat_arguments, chat_turn, hermes_messages, hermes_tools_prompt

__all__ = [
    "HERMES",
    "LLAMA3_JSON",
    "MAX_WHITESPACE",
    "TOOL_FORMATS",
    "CallDelta",
    "Parsed",
    "ToolCallParser",
    "ToolFormat",
    "chat_arguments",
    "chat_turn",
    "format_for_template",
    "hermes_messages",
    "hermes_tools_prompt",
    "openai_tool",
    "tool_constraint",
]
