"""Tools, tool calls and output constraints: the transport-neutral forms every edge shares.

The gateway's HTTP APIs (OpenAI chat, Responses, Anthropic Messages) and its gRPC edge each parse
their own shapes into these; ``core.wire`` carries them to the worker (``common.proto``: ``Tool``,
``ToolChoice``, ``ToolCall``, ``OutputConstraint``).  The worker
renders tools into the prompt, turns tools and a tool choice into a grammar, and parses calls back
out of the output (docs/tools.md).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag"]
ToolChoiceMode = Literal["auto", "none", "required", "function"]


class ToolCallPiece(Protocol):
    """A streamed piece of a call (``common_pb2.ToolCallDelta`` is one)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class OutputConstraint:
    """What the output must match.  ``spec``: the JSON Schema's or structural tag's JSON text, the
    regular expression, the EBNF grammar, or (``choice``) a JSON list of strings; "" for
    ``json_object``."""

    kind: ConstraintKind
    spec: str = ""

    @classmethod
    def of_schema(cls, schema: dict[str, Any]) -> OutputConstraint:
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # a JSON Schema object; None: any object
    strict: bool = False

    def schema(self) -> dict[str, Any]:
        """The arguments' JSON Schema (``{"type": "object"}`` when the tool gave none)."""
        return self.parameters if self.parameters is not None else {"type": "object"}

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``{"type": "function", "function": {...}}``, as chat templates expect a tool."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.schema()
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "auto"
    name: str = ""  # the function, for mode "function"


@dataclass(frozen=True)
class ToolCall:
    """A complete call: ``arguments`` is the arguments' JSON text."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def new_call_id(prefix: str = "call_") -> str:
    """A fresh tool-call id (OpenAI's ``call_...``; Anthropic's ``toolu_...`` with that prefix)."""
    return prefix + secrets.token_hex(12)


def assemble_calls(deltas: Sequence[ToolCallPiece]) -> tuple[ToolCall, ...]:
    """The complete calls a choice's stream of ``ToolCallDelta`` pieces spells, in index order."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        entry = calls.setdefault(delta.index, ["", "", ""])
        if delta.id:
            entry[0] = delta.id
        if delta.name:
            entry[1] = delta.name
        entry[2] += delta.arguments
    return tuple(ToolCall(*calls[index]) for index in sorted(calls))


def tool_of_last_result(turns: Sequence[Any]) -> str | None:
    """The name of the tool whose result is the conversation's latest turn, found through the
    ``tool_call_id`` it answers among earlier assistant calls; None when the last turn is not a
    tool result, or names no known call.  ``turns``: ``openai_schema.ChatTurn``s."""
    if not turns or turns[-1].role != "tool":
        return None
    call_id = turns[-1].tool_call_id
    for turn in reversed(turns[:-1]):
        for call in turn.tool_calls:
            if call.id == call_id:
                return str(call.name)
    return turns[-1].name or None


__all__ = [
    "ConstraintKind",
    "OutputConstraint",
    "ToolCall",
    "ToolCallPiece",
    "ToolChoice",
    "ToolChoiceMode",
    "ToolSpec",
    "assemble_calls",
    "new_call_id",
    "tool_of_last_result",
]
