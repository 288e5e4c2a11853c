"""The messages and tools of an OpenAI chat body as it sends them: the message, tool and call
models, and ``Strict``, the base of every body model (``openai_schema``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from clairvoyant.core.openai_structure import function_name
from clairvoyant.core.structured import ToolCall, ToolSpec

MAX_CALL_ID_CHARS = 256

# The JSON schema of ``content``, checked by hand (``ChatMessageIn._text``), for /openapi.json.
_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["type", "text"],
}
CONTENT_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]}
)


class Strict(BaseModel):
    # strict: "0.5" is not a number and 1 is not true; extra="ignore": what check_parameters let
    # through without a field here (ignored parameters, refused ones that ask for nothing) is dropped.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class FunctionIn(Strict):
    """A tool's function (OpenAI's ``tools[].function``)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema object; unset: any object
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return function_name(value)


class ToolIn(Strict):
    type: Literal["function"]  # OpenAI's custom tools (free text) are not served
    function: FunctionIn

    def spec(self) -> ToolSpec:
        f = self.function
        return ToolSpec(f.name, f.description or "", f.parameters, bool(f.strict))


class FunctionCallIn(Strict):
    name: str
    arguments: str  # JSON text, as the model wrote it

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return function_name(value)


class ToolCallIn(Strict):
    """A call in an earlier assistant turn (``messages[].tool_calls[]``)."""

    id: str = Field(min_length=1, max_length=MAX_CALL_ID_CHARS)
    type: Literal["function"]
    function: FunctionCallIn

    def call(self) -> ToolCall:
        return ToolCall(self.id, self.function.name, self.function.arguments)


class ChatMessageIn(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Annotated[Any, CONTENT_SCHEMA] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant turn's
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=MAX_CALL_ID_CHARS)  # a tool turn's

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str | None:
        """A string, or a list of ``{"type": "text", "text": ...}`` parts (joined); null stays null."""
        if value is None or isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"part {i} must be {{'type': 'text', 'text': <string>}}; only text is supported, got {kind!r}"
                )
            texts.append(part["text"])
        return "".join(texts)
