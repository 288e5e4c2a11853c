"""Anthropic's content blocks: the rules for a tool's name and a tool_use id, the blocks' JSON
schemas (for /openapi.json), and the message model that holds them.  The request and the answer
side of ``POST /v1/messages`` share them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

BLOCK_SEPARATOR = "\n"  # between the text blocks of one turn, and between merged turns

# Anthropic's rules: a tool's name, and a tool_use block's id.
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,256}$")

_TEXT_BLOCK = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
_TOOL_USE_BLOCK = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_use"},
        "id": {"type": "string", "pattern": TOOL_USE_ID.pattern},
        "name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
        "input": {"type": "object"},
    },
    "required": ["type", "id", "name", "input"],
}
_TOOL_RESULT_BLOCK = {
    "type": "object",
    "properties": {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
        "is_error": {"type": "boolean"},
    },
    "required": ["type", "tool_use_id"],
}
CONTENT_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"anyOf": [_TEXT_BLOCK, _TOOL_USE_BLOCK, _TOOL_RESULT_BLOCK]}},
        ]
    }
)
SYSTEM_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}, {"type": "null"}]}
)


class Strict(BaseModel):
    # As the OpenAI bodies: "0.5" is not a number; fields check_parameters let through are dropped.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class MessageIn(Strict):
    role: Literal["user", "assistant", "system"]  # a system message mid-conversation, as the SDK types allow
    content: Annotated[Any, CONTENT_SCHEMA] = Field()  # a string or blocks (``parse_message``)
