"""The grammar that keeps calls well formed: an xgrammar structural tag from the tools and the
tool choice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import xgrammar as xgr

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.structured import OutputConstraint, ToolChoice, ToolSpec
from clairvoyant.worker.tools.formats import ToolFormat

# At most this many whitespace characters in a row between the arguments' JSON tokens: ", " and
# ": " as json.dumps writes them, or a newline, but not the endless layout a weak model can fill
# max_tokens with while every character keeps the JSON valid.
MAX_WHITESPACE = 1


def tool_constraint(
    fmt: ToolFormat, tools: Sequence[ToolSpec], choice: ToolChoice, parallel_tool_calls: bool = True
) -> OutputConstraint | None:
    """The structural tag (xgrammar's ``get_model_structural_tag``, ``MAX_WHITESPACE``) that keeps calls well formed:
    ``auto`` checks a call once begun and leaves text free; ``required`` needs at least one call;
    ``function`` exactly that function's call; ``none`` (or no tools) constrains nothing, as vLLM
    does.  Raises InvalidRequest (``tool_choice``) for a choice the tools cannot meet."""
    if choice.mode == "none":
        return None
    if not tools:
        if choice.mode == "auto":
            return None
        raise InvalidRequest(f"tool_choice {choice.mode!r} needs tools", param="tool_choice")
    names = [tool.name for tool in tools]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise InvalidRequest(f"tools: the names {duplicated} occur more than once", param="tools")
    xgr_choice: Literal["auto", "required"] | dict[str, Any] = "required" if choice.mode == "required" else "auto"
    if choice.mode == "function":
        if choice.name not in names:
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not among the tools {names}", param="tool_choice"
            )
        xgr_choice = {"type": "function", "function": {"name": choice.name}}
    tag = xgr.get_model_structural_tag(
        fmt.structural_tag_family,
        tools=[openai_tool(tool) for tool in tools],
        tool_choice=xgr_choice,
        reasoning="disabled",
        parallel_tool_calls=parallel_tool_calls,
        max_whitespace_cnt=MAX_WHITESPACE,
    )
    return OutputConstraint("structural_tag", tag.model_dump_json())


def openai_tool(tool: ToolSpec) -> dict[str, Any]:
    """OpenAI's tool dict, with ``strict`` set so that xgrammar enforces the schema (it treats a
    ``strict: false`` schema as unconstrained; here every call follows its tool's schema)."""
    spec = tool.openai()
    spec["function"]["strict"] = True
    return spec
