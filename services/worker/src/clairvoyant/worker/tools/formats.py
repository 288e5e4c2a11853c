"""Call formats: how a model writes a call, registered by name in ``TOOL_FORMATS``, and the small
JSON scanning the parser shares with them.

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, as Qwen2.5's
  and Hermes' templates document it (xgrammar's ``qwen_3`` structural tag).
- ``llama3_json``: a bare ``{"name": ..., "parameters": {...}}`` object, as Llama 3.1's model
  card documents JSON tool calling (xgrammar's ``llama`` structural tag).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


class JsonValueEnd:
    """Finds where one JSON value ends, fed a character at a time (objects, arrays, strings and
    scalars; it checks nesting, not the grammar)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.started = False
        self.scalar = False

    def feed(self, char: str) -> bool:
        """True when ``char`` completes the value (a scalar completes on the character after it,
        which the caller keeps)."""
        if not self.started:
            self.started = True
            if char in "{[":
                self.depth = 1
            elif char == '"':
                self.in_string = True
            else:
                self.scalar = True
            return False
        if self.scalar:
            return char in " \t\r\n,}]"
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
                return self.depth == 0
            return False
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


def escape_control(char: str) -> str:
    return json.dumps(char)[1:-1]


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker`` (but is not all of it)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


_STRING = r'"((?:[^"\\]|\\.)*)"'


@dataclass(frozen=True)
class ToolFormat:
    """One way of writing calls: how a call starts and ends, and the xgrammar structural-tag
    family that generates exactly that."""

    name: str
    structural_tag_family: str  # xgrammar.get_model_structural_tag's model key
    start: str  # the text that opens a call ("" when the call's own JSON opens it)
    start_pattern: re.Pattern[str]
    header: re.Pattern[str]  # the call up to its arguments; group 1 is the name's JSON string body
    closing: re.Pattern[str]  # after the arguments, up to the end of the call
    closing_prefix: re.Pattern[str]  # what ``closing`` may still become
    separators: str  # layout dropped between and after calls

    def find_start(self, text: str) -> tuple[int, int] | None:
        match = self.start_pattern.search(text)
        return None if match is None else (match.start(), match.start() + len(self.start))

    def partial_start(self, text: str) -> int:
        return partial_suffix(text, self.start_marker)

    @property
    def start_marker(self) -> str:
        return self.start or '{"name":'

    def end_of_unparsed(self, header: str) -> int | None:
        """Where an unparsed call ends (just past it), or None while it may still go on."""
        if self.start:
            end = header.find("</tool_call>")
            return None if end < 0 else end + len("</tool_call>")
        scanner = JsonValueEnd()
        for position, char in enumerate(header.lstrip()):
            if scanner.feed(char):
                return len(header) - len(header.lstrip()) + position + 1
        return None

    def read_whole(self, body: str) -> tuple[str, str] | None:
        """A complete call's name and arguments' JSON text, or None when it is not one."""
        text = body[: -len("</tool_call>")] if self.start and body.endswith("</tool_call>") else body
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", value.get("parameters"))
        if not isinstance(arguments, dict):
            return None
        return value["name"], json.dumps(arguments, ensure_ascii=False)


def _header(arguments_key: str) -> re.Pattern[str]:
    return re.compile(r'\s*\{\s*"name"\s*:\s*' + _STRING + r'\s*,\s*"' + arguments_key + r'"\s*:\s*(?=\S)')



HERMES = ToolFormat(
    name="hermes",
    structural_tag_family="qwen_3",
    start="<tool_call>",
    start_pattern=re.compile(re.escape("<tool_call>")),
    header=_header("arguments"),
    closing=re.compile(r"\s*\}\s*</tool_call>"),
    closing_prefix=re.compile(
        r"\s*(\}\s*(" + "|".join(re.escape("</tool_call>"[:k]) for k in range(12)) + r"))?"
    ),
    separators=" \t\r\n",
)

LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    structural_tag_family="llama",
    start="",
    start_pattern=re.compile(r'\{(?=\s*"name"\s*:)'),
    header=_header("(?:parameters|arguments)"),
    closing=re.compile(r"\s*\}"),
    closing_prefix=re.compile(r"\s*"),
    separators=" \t\r\n;",  # vLLM's llama3_json parser splits parallel calls on "; "
)

TOOL_FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in (HERMES, LLAMA3_JSON)}


def format_for_template(template: str | None, forced: str = "") -> ToolFormat:
    """The call format for a model: ``forced`` (a worker setting) when set, Llama 3.1 JSON when
    its template is Llama 3's (it mentions ``<|python_tag|>``, or ``"parameters"`` beside its
    tools), Hermes otherwise (and for templates that do not mention tools at all, whose prompt
    then carries Hermes-style instructions, ``runners.tokenizer``)."""
    if forced:
        if forced not in TOOL_FORMATS:
            raise ValueError(f"unknown tool-call format {forced!r}; known: {sorted(TOOL_FORMATS)}")
        return TOOL_FORMATS[forced]
    source = template or ""
    if "<|python_tag|>" in source or ("tools" in source and '"parameters"' in source):
        return LLAMA3_JSON
    return HERMES
