"""What an OpenAI body asks of the output's shape beyond sampling, parsed: OpenAI's ``tool_choice``
and ``response_format``, vLLM's ``structured_outputs``, the rule for a function's name, and the
``Structure`` (tools, tool choice, one output constraint) they make as ``core.structured``
values.  ``openai_schema``'s bodies call these: ``parse_tool_choice`` and ``parse_response_format``
are field validators and raise ValueError (pydantic names the field); the rest raise
InvalidRequest naming the parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from pydantic import WithJsonSchema

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.structured import OutputConstraint, ToolChoice, ToolSpec

# OpenAI's rule for a function's name, and for a json_schema response format's name.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
NAME_RULE = "1 to 64 characters from a-z A-Z 0-9 _ -"
TOOL_CHOICE_MODES = ("auto", "none", "required")
# vLLM's structured_outputs keys, and the constraint kind each asks for.
STRUCTURED_OUTPUT_KINDS: dict[str, str] = {
    "json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "ebnf",
    "json_object": "json_object", "structural_tag": "structural_tag",
}  # fmt: skip

# The JSON schemas of the fields parsed here, for /openapi.json.
TOOL_CHOICE_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"enum": list(TOOL_CHOICE_MODES)},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                },
                "required": ["type", "function"],
            },
            {"type": "null"},
        ]
    }
)
RESPONSE_FORMAT_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "json_schema"},
                    "json_schema": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
                            "description": {"type": "string"},
                            "schema": {"type": "object"},
                            "strict": {"type": ["boolean", "null"]},
                        },
                        "required": ["name", "schema"],
                    },
                },
                "required": ["type", "json_schema"],
            },
            {"type": "object", "properties": {"type": {"const": "structural_tag"}}, "required": ["type"]},
            {"type": "null"},
        ]
    }
)
JSON_TEXT_OR_OBJECT_SCHEMA = WithJsonSchema(
    {"anyOf": [{"type": "object"}, {"type": "string", "description": "the object as JSON text"}, {"type": "null"}]}
)


def function_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(f"must be {NAME_RULE}, got {value[:80]!r}")
    return value


def parse_tool_choice(value: Any) -> ToolChoice | None:
    """OpenAI's forms: "auto" | "none" | "required" | {"type": "function", "function": {"name"}}."""
    if value is None:
        return None
    if isinstance(value, str) and value in TOOL_CHOICE_MODES:
        return ToolChoice(value)  # type: ignore[arg-type]  # one of the literal modes
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise ValueError(
            'must be "auto", "none", "required" or {"type": "function", "function": {"name": <a tool\'s name>}}'
        )
    return ToolChoice("function", name)


def parse_response_format(value: Any) -> OutputConstraint | None:
    """OpenAI's text, json_object and json_schema; SGLang's and vLLM's structural_tag."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "structural_tag":
        return OutputConstraint("structural_tag", json.dumps(value))
    if kind != "json_schema":
        raise ValueError('type must be "text", "json_object", "json_schema" or "structural_tag"')
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError('a "json_schema" format needs json_schema: {"name": ..., "schema": {...}}')
    if not isinstance(spec.get("name"), str) or not NAME_PATTERN.match(spec["name"]):
        raise ValueError(f"json_schema.name is required: {NAME_RULE}")
    if not isinstance(spec.get("schema"), dict):
        raise ValueError("json_schema.schema is required: a JSON Schema object")
    for key, kinds in (("strict", (bool, type(None))), ("description", (str, type(None)))):
        if not isinstance(spec.get(key), kinds):
            raise ValueError(f"json_schema.{key} must be a {'boolean' if key == 'strict' else 'string'}")
    return OutputConstraint.of_schema(spec["schema"])


class Structure(NamedTuple):
    """What a body asks of the output's shape (``GenerationBody.structure``)."""

    constraint: OutputConstraint | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None  # None: "auto" when there are tools
    parallel_tool_calls: bool = True


def one_constraint(found: list[tuple[str, OutputConstraint]]) -> OutputConstraint | None:
    if len(found) > 1:
        (first, _), (second, _) = found[:2]
        raise InvalidRequest(
            f"{second} cannot be combined with {first}: at most one output constraint per request",
            param=second,
            code="invalid_value",
        )
    return found[0][1] if found else None


def structured_outputs(raw: dict[str, Any]) -> list[tuple[str, OutputConstraint]]:
    """vLLM's ``structured_outputs`` object: one of its keys ``json``, ``regex``, ``choice``,
    ``grammar``, ``json_object``, ``structural_tag`` (null or false ones count as unset)."""
    found = []
    for key, value in raw.items():
        param = f"structured_outputs.{key}"
        kind = STRUCTURED_OUTPUT_KINDS.get(key)
        if kind is None:
            if value is None or value is False:
                continue
            known = ", ".join(STRUCTURED_OUTPUT_KINDS)
            raise InvalidRequest(f"{param} is not supported; known: {known}", param=param, code="unsupported_parameter")
        if value is None or (kind == "json_object" and value is False):
            continue
        found.append((param, _structured_output(kind, value, param)))
    return found


def _structured_output(kind: str, value: Any, param: str) -> OutputConstraint:
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest(f"{param} must be a boolean", param=param, code="invalid_type")
        return OutputConstraint("json_object")
    if kind in ("json_schema", "structural_tag"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        if not isinstance(value, dict):
            raise InvalidRequest(f"{param} must be a JSON object or its JSON text", param=param, code="invalid_type")
        return OutputConstraint(kind, json.dumps(value, separators=(",", ":")))  # type: ignore[arg-type]
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest(f"{param} must be a non-empty list of non-empty strings", param=param, code="invalid_type")
        return OutputConstraint("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{param} must be a non-empty string", param=param, code="invalid_type")
    return OutputConstraint(kind, value)  # type: ignore[arg-type]  # regex or ebnf
