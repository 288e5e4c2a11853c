"""Tools in the prompt (the model's template, or Qwen2.5's wording for templates without tools),
the call format chosen from the template, and the grammar built from tools and tool_choice."""

from __future__ import annotations

import json
import random
from datetime import datetime
from typing import Any

import pytest
import xgrammar as xgr

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.structured import ToolChoice, ToolSpec, assemble_calls
from clairvoyant.worker.runners.tiny_random import TINY_SPECIAL_TOKENS
from clairvoyant.worker.runners.tokenizer import CHATML_TEMPLATE, ByteTokenizer, ChatTemplate, template_source
from clairvoyant.worker.tools import (
    HERMES,
    LLAMA3_JSON,
    ToolCallParser,
    ToolFormat,
    format_for_template,
    hermes_tools_prompt,
    tool_constraint,
)

pytestmark = pytest.mark.unit

# Qwen2.5-Instruct's chat template (tokenizer_config.json), verbatim.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Llama 3.1-Instruct's template, its JSON tool-calling part (the built-in tool branches, which
# write <|python_tag|> calls, left out).
LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

WEATHER = ToolSpec(
    "weather",
    "Current weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SEARCH = ToolSpec("search", "", {"type": "object", "properties": {"q": {"type": "string", "maxLength": 8}}})
TOOLS = [WEATHER.openai(), SEARCH.openai()]


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and news?"},
    {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [call("c1", "weather", {"city": "Paris"}), call("c2", "search", {"q": "news"})],
    },
    {"role": "tool", "content": "18C", "tool_call_id": "c1"},
    {"role": "tool", "content": "none", "tool_call_id": "c2"},
]

QWEN25_EXPECTED = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
    "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "weather", "description": "Current weather", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
    '{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": '
    '{"q": {"type": "string", "maxLength": 8}}}}}\n'
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris and news?<|im_end|>\n"
    "<|im_start|>assistant\nChecking.\n"
    '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "search", "arguments": {"q": "news"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\nnone\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)

CHATML_SPECIALS = {"bos_token": "<s>", "eos_token": "<|im_end|>"}


def test_qwen25_template_renders_tools_calls_and_results_as_its_model_card_shows() -> None:
    assert ChatTemplate(QWEN25_TEMPLATE, CHATML_SPECIALS).render(CHAT, tools=TOOLS) == QWEN25_EXPECTED


def test_a_template_without_tools_gets_qwen25s_wording_word_for_word() -> None:
    # CHATML_TEMPLATE knows only role and content; the chat is rewritten into plain turns.
    assert ChatTemplate(CHATML_TEMPLATE, CHATML_SPECIALS).render(CHAT, tools=TOOLS) == QWEN25_EXPECTED


def test_fallback_without_a_system_turn_adds_one_holding_the_tools() -> None:
    chat = [{"role": "user", "content": "Hi"}]
    rendered = ChatTemplate(CHATML_TEMPLATE, CHATML_SPECIALS).render(chat, tools=[WEATHER.openai()])
    assert rendered == (
        f"<|im_start|>system\n{hermes_tools_prompt([WEATHER.openai()])}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert hermes_tools_prompt([WEATHER.openai()]).startswith("# Tools\n\nYou may call one or more functions")


def test_without_tools_and_tool_turns_the_rendering_is_unchanged() -> None:
    chat = [{"role": "user", "content": "Hi"}]
    template = ChatTemplate(CHATML_TEMPLATE, CHATML_SPECIALS)
    assert template.render(chat) == template.render(chat, tools=None) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_byte_tokenizer_encodes_the_rendered_tools() -> None:
    tokenizer = ByteTokenizer(TINY_SPECIAL_TOKENS)
    ids = tokenizer.apply_chat_template(CHAT, tools=TOOLS)
    assert tokenizer.decode(ids) == tokenizer.decode(tokenizer.encode(tokenizer.chat_template.render(CHAT, tools=TOOLS)))
    assert "<tool_response>\n18C\n</tool_response>" in tokenizer.decode(ids)


def test_llama31_template_renders_json_tools_as_its_model_card_shows() -> None:
    chat = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("c1", "weather", {"city": "Paris"})]},
        {"role": "tool", "content": "18C", "tool_call_id": "c1"},
    ]
    template = ChatTemplate(LLAMA31_TEMPLATE, {"bos_token": "<|begin_of_text|>"}, now=lambda: datetime(2024, 7, 26))
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper arguments "
        "that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n"
        + json.dumps(WEATHER.openai(), indent=4)
        + "\n\nWeather in Paris?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '{"name": "weather", "parameters": {"city": "Paris"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n"18C"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert template.render(chat, tools=[WEATHER.openai()]) == expected


def test_the_call_format_follows_the_template() -> None:
    assert format_for_template(QWEN25_TEMPLATE) is HERMES
    assert format_for_template(LLAMA31_TEMPLATE) is LLAMA3_JSON
    assert format_for_template("{{ '<|python_tag|>' }}") is LLAMA3_JSON
    assert format_for_template(CHATML_TEMPLATE) is HERMES
    assert format_for_template(None) is HERMES
    assert format_for_template(QWEN25_TEMPLATE, "llama3_json") is LLAMA3_JSON
    with pytest.raises(ValueError, match="unknown tool-call format"):
        format_for_template(None, "xml")
    assert template_source(ByteTokenizer(TINY_SPECIAL_TOKENS)) == CHATML_TEMPLATE
    assert template_source(object()) is None


# ---- grammar ----------------------------------------------------------------------------------

_BYTES = xgr.TokenizerInfo([bytes([i]) for i in range(256)] + [b""], xgr.VocabType.RAW, stop_token_ids=[256])
_COMPILER = xgr.GrammarCompiler(_BYTES)


def accepts(spec: str, text: str) -> bool:
    """Whether the structural tag lets the model write ``text`` and then stop."""
    matcher = xgr.GrammarMatcher(_COMPILER.compile_structural_tag(spec))
    return matcher.accept_string(text) and matcher.accept_token(256)


WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SEARCH_CALL = '<tool_call>\n{"name": "search", "arguments": {"q": "news"}}\n</tool_call>'
TOOL_SPECS = [WEATHER, SEARCH]


def test_required_needs_a_call_that_follows_its_schema() -> None:
    constraint = tool_constraint(HERMES, TOOL_SPECS, ToolChoice("required"))
    assert constraint is not None and constraint.kind == "structural_tag"
    assert accepts(constraint.spec, WEATHER_CALL)
    assert accepts(constraint.spec, WEATHER_CALL + SEARCH_CALL)
    assert not accepts(constraint.spec, "Hello")
    assert not accepts(constraint.spec, WEATHER_CALL.replace('"city"', '"town"'))  # required property missing
    assert not accepts(constraint.spec, SEARCH_CALL.replace("news", "far too long"))  # maxLength 8


def test_auto_leaves_text_free_and_checks_calls() -> None:
    constraint = tool_constraint(HERMES, TOOL_SPECS, ToolChoice("auto"))
    assert constraint is not None
    assert accepts(constraint.spec, "Hello")
    assert accepts(constraint.spec, "Sure. " + WEATHER_CALL)
    assert not accepts(constraint.spec, '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>')


def test_a_named_function_allows_exactly_that_call() -> None:
    constraint = tool_constraint(HERMES, TOOL_SPECS, ToolChoice("function", "search"))
    assert constraint is not None
    assert accepts(constraint.spec, SEARCH_CALL)
    assert not accepts(constraint.spec, WEATHER_CALL)
    assert not accepts(constraint.spec, SEARCH_CALL + SEARCH_CALL)


def test_parallel_calls_off_allows_one_call() -> None:
    constraint = tool_constraint(HERMES, TOOL_SPECS, ToolChoice("required"), parallel_tool_calls=False)
    assert constraint is not None
    assert accepts(constraint.spec, WEATHER_CALL)
    assert not accepts(constraint.spec, WEATHER_CALL + SEARCH_CALL)


def test_llama_format_grammar() -> None:
    constraint = tool_constraint(LLAMA3_JSON, TOOL_SPECS, ToolChoice("required"))
    assert constraint is not None
    assert accepts(constraint.spec, '{"name": "weather", "parameters": {"city": "Paris"}}')
    assert not accepts(constraint.spec, '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def test_none_and_no_tools_constrain_nothing() -> None:
    assert tool_constraint(HERMES, TOOL_SPECS, ToolChoice("none")) is None
    assert tool_constraint(HERMES, [], ToolChoice("auto")) is None


@pytest.mark.parametrize(
    ("tools", "choice", "param", "message"),
    [
        (TOOL_SPECS, ToolChoice("function", "missing"), "tool_choice", "'missing', which is not among the tools"),
        ([], ToolChoice("required"), "tool_choice", "needs tools"),
        ([], ToolChoice("function", "weather"), "tool_choice", "needs tools"),
        ([WEATHER, WEATHER], ToolChoice("auto"), "tools", "more than once"),
    ],
)
def test_choices_the_tools_cannot_meet_are_invalid(
    tools: list[ToolSpec], choice: ToolChoice, param: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as raised:
        tool_constraint(HERMES, tools, choice)
    assert raised.value.param == param


def random_schema(rng: random.Random) -> dict[str, Any]:
    """An object schema whose every value is bounded (a model under its grammar must finish it)."""
    kinds = [
        lambda: {"type": "string", "maxLength": rng.randint(1, 6)},
        lambda: {"type": "string", "enum": rng.sample(["red", "green", "blue", "a b", "é", "x\"y"], rng.randint(1, 3))},
        lambda: {"type": "integer", "minimum": rng.randint(-50, 0), "maximum": rng.randint(1, 50)},
        lambda: {"type": "boolean"},
        lambda: {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 0,
            "maxItems": rng.randint(1, 3),
        },
    ]
    names = rng.sample(["city", "count", "flag", "tags", "mode", "q", "unit", "n"], rng.randint(1, 4))
    properties = {name: rng.choice(kinds)() for name in names}
    return {
        "type": "object",
        "properties": properties,
        "required": names,
        "additionalProperties": False,
    }


def sample_from_grammar(spec: str, rng: random.Random, max_steps: int = 600) -> str:
    """A random walk through what the grammar allows, as a model with random weights would write
    under it; where the grammar allows the end (free text after calls), it ends one time in five."""
    matcher = xgr.GrammarMatcher(_COMPILER.compile_structural_tag(spec))
    mask = xgr.allocate_token_bitmask(1, 257)
    out = bytearray()
    for _ in range(max_steps):
        matcher.fill_next_token_bitmask(mask)
        words = mask[0].tolist()
        allowed = [t for t in range(257) if (words[t // 32] >> (t % 32)) & 1]
        token = 256 if 256 in allowed and rng.random() < 0.2 else rng.choice(allowed)
        assert matcher.accept_token(token)
        if token == 256:
            return out.decode("utf-8", errors="replace")  # as the detokenizer does
        out.extend([token])
    raise AssertionError(f"the grammar did not end within {max_steps} bytes: {bytes(out)!r}")


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON], ids=lambda f: f.name)
def test_whatever_the_grammar_lets_through_parses_into_valid_calls(fmt: ToolFormat) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    rng = random.Random(5)
    for _ in range(40):
        tools = [ToolSpec(f"t{k}", "", random_schema(rng)) for k in range(rng.randint(1, 3))]
        constraint = tool_constraint(fmt, tools, ToolChoice("required"), parallel_tool_calls=rng.random() < 0.5)
        assert constraint is not None
        text = sample_from_grammar(constraint.spec, rng)
        parser = ToolCallParser(fmt)
        pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
        deltas = [d for piece in pieces for d in parser.feed(piece).calls] + list(parser.finish().calls)
        calls = assemble_calls(deltas)
        assert calls, text
        by_name = {tool.name: tool for tool in tools}
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), by_name[call.name].schema())
