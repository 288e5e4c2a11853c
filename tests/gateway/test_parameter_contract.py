"""Every OpenAI request parameter is supported (with its effect), ignored, or refused with a 400
naming it; unknown fields are refused unless the gateway is lenient; docs/openai-api.md lists
exactly the table the code holds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import openai
import pytest

from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.openai_parameters import BOTH, PARAMETERS, Api, Parameter, parameters
from clairvoyant.core.openai_schema import (
    ChatCompletionBody,
    CompletionBody,
    InputLimits,
    validate_body,
)
from clairvoyant.core.structured import OutputConstraint, ToolChoice, ToolSpec
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.openai_api import to_request
from clairvoyant.gateway.request import Endpoint, GenerationRequest, Sampling
from tests.gateway.conftest import Stack, StackFactory
from tests.gateway.fakes import MODEL

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-api.md"
MSG = [{"role": "user", "content": "hi"}]
META = {"workflow_type_id": "wf", "workflow_id": "w1", "agent_id": "a1"}
PATHS: dict[Api, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
STRICT, LENIENT = InputLimits(), InputLimits(lenient_parameters=True)


class Effect(NamedTuple):
    """A value of a supported (or extension) parameter and what it does to the request."""

    value: Any
    read: Callable[[GenerationRequest], object]
    expected: object


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
STRUCTURAL_TAG = {"type": "structural_tag", "format": {"type": "const_string", "value": "ok"}}
EFFECTS: dict[str, Effect] = {
    "model": Effect("other-model", lambda r: r.model, "other-model"),
    "messages": Effect([{"role": "user", "content": "bye"}], lambda r: r.input_text(), "bye"),
    "prompt": Effect("bye", lambda r: r.input_text(), "bye"),
    "max_tokens": Effect(7, lambda r: r.sampling.max_tokens, 7),
    "max_completion_tokens": Effect(9, lambda r: r.sampling.max_tokens, 9),
    "n": Effect(3, lambda r: r.sampling.n, 3),
    "seed": Effect(5, lambda r: r.sampling.seed, 5),
    "stop": Effect(["END"], lambda r: r.sampling.stop, ("END",)),
    "stream": Effect(True, lambda r: r.stream, True),
    # Usage rides on streams only; on its own the option changes nothing in the request.
    "stream_options": Effect({"include_usage": True}, lambda r: r.sampling, Sampling()),
    "temperature": Effect(0.5, lambda r: r.sampling.temperature, 0.5),
    "top_p": Effect(0.9, lambda r: r.sampling.top_p, 0.9),
    "app_metadata": Effect(META, lambda r: r.app_metadata and r.app_metadata.agent_id, "a1"),
    "echo_annotations": Effect(True, lambda r: r.echo_annotations, True),
    "extra_body": Effect({"temperature": 1.5}, lambda r: r.sampling.temperature, 1.5),
    "ignore_eos": Effect(True, lambda r: r.sampling.ignore_eos, True),
    "min_tokens": Effect(2, lambda r: r.sampling.min_tokens, 2),
    "frequency_penalty": Effect(0.5, lambda r: r.sampling.frequency_penalty, 0.5),
    "presence_penalty": Effect(-1, lambda r: r.sampling.presence_penalty, -1),
    "repetition_penalty": Effect(1.2, lambda r: r.sampling.repetition_penalty, 1.2),
    "logit_bias": Effect({"50256": -100, "7": 2.5}, lambda r: r.sampling.logit_bias, ((7, 2.5), (50256, -100.0))),
    "logprobs": Effect(True, lambda r: r.sampling.logprobs, 0),  # chat: a bool, no alternatives
    "top_logprobs": Effect(3, lambda r: r.sampling.logprobs, 3),  # with logprobs: true (BASE_ON)
    "tools": Effect([TOOL], lambda r: r.tools, (ToolSpec("lookup", "", {"type": "object"}, False),)),
    "tool_choice": Effect("required", lambda r: r.tool_choice, ToolChoice("required")),  # with tools
    "parallel_tool_calls": Effect(False, lambda r: r.parallel_tool_calls, False),  # with tools
    "response_format": Effect(
        {"type": "json_object"}, lambda r: r.sampling.constraint, OutputConstraint("json_object")
    ),
    "guided_json": Effect(
        {"type": "object"}, lambda r: r.sampling.constraint, OutputConstraint("json_schema", '{"type":"object"}')
    ),
    "guided_regex": Effect("a+", lambda r: r.sampling.constraint, OutputConstraint("regex", "a+")),
    "guided_choice": Effect(
        ["yes", "no"], lambda r: r.sampling.constraint, OutputConstraint("choice", '["yes", "no"]')
    ),
    "guided_grammar": Effect('root ::= "a"', lambda r: r.sampling.constraint, OutputConstraint("ebnf", 'root ::= "a"')),
    "structural_tag": Effect(
        STRUCTURAL_TAG, lambda r: r.sampling.constraint, OutputConstraint("structural_tag", json.dumps(STRUCTURAL_TAG))
    ),
    "structured_outputs": Effect({"regex": "b+"}, lambda r: r.sampling.constraint, OutputConstraint("regex", "b+")),
}
EFFECTS_ON: dict[tuple[Api, str], Effect] = {
    ("completions", "logprobs"): Effect(2, lambda r: r.sampling.logprobs, 2),  # a count there
}
BASE_ON: dict[tuple[Api, str], dict[str, Any]] = {
    ("chat", "top_logprobs"): {"logprobs": True},
    ("chat", "tool_choice"): {"tools": [TOOL]},
    ("chat", "parallel_tool_calls"): {"tools": [TOOL]},
}
# Through the gateway, whose fake worker answers one choice.
HTTP_VALUES: dict[str, Any] = {"n": 1}
IGNORED_SAMPLES: dict[str, Any] = {
    "user": "user-17",
    "safety_identifier": "hashed-user",
    "prompt_cache_key": "key-1",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "prompt_cache_retention": "24h",
    "metadata": {"team": "search"},
    "prediction": {"type": "content", "content": "draft"},
    "service_tier": "flex",
}
# A value of each refused parameter that asks for what this API cannot do.
ASKS: dict[str, Any] = {
    "functions": [TOOL["function"]],
    "function_call": {"name": "lookup"},
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "moderation": {"model": "omni-moderation-latest"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "store": True,
    "best_of": 2,
    "echo": True,
    "suffix": "}",
}
ASKS_ON: dict[tuple[Api, str], Any] = {}
UNKNOWN = ["temperatur", "foo", "guided_jsn", "frequency_penalties"]


def body(api: Api, **fields: Any) -> dict[str, Any]:
    text: dict[str, Any] = {"messages": MSG} if api == "chat" else {"prompt": "hi"}
    return {"model": "m", **text, **fields}


def request(api: Api, raw: dict[str, Any], limits: InputLimits = STRICT) -> GenerationRequest:
    validated: ChatCompletionBody | CompletionBody = (
        validate_body(raw, ChatCompletionBody, limits)
        if api == "chat"
        else validate_body(raw, CompletionBody, limits)
    )
    endpoint: Endpoint = "chat.completions" if api == "chat" else "completions"
    return to_request(
        validated, tenant="t", endpoint=endpoint, request_id="r", arrival_time=0.0, max_tokens_limit=100
    )


def refusal(api: Api, raw: dict[str, Any], limits: InputLimits = STRICT) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        request(api, raw, limits)
    return caught.value


def cases(*statuses: str) -> list[Any]:
    return [
        pytest.param(api, p, id=f"{api}-{p.name}")
        for p in PARAMETERS
        if p.status in statuses
        for api in p.apis
    ]


def asks(api: Api, parameter: Parameter) -> Any:
    return ASKS_ON.get((api, parameter.name), ASKS[parameter.name])


# Through validate_body and to_request: every parameter of the table.


@pytest.mark.unit
@pytest.mark.parametrize(("api", "parameter"), cases("supported", "extension"))
def test_a_supported_parameter_has_its_effect(api: Api, parameter: Parameter) -> None:
    effect = EFFECTS_ON.get((api, parameter.name), EFFECTS[parameter.name])
    base = BASE_ON.get((api, parameter.name), {})
    bare = request(api, body(api, **base))
    given = request(api, body(api, **base, **{parameter.name: effect.value}))
    assert effect.read(given) == effect.expected
    if parameter.name != "stream_options":
        assert effect.read(bare) != effect.expected  # the value did something


@pytest.mark.unit
@pytest.mark.parametrize(("api", "parameter"), cases("ignored"))
def test_an_ignored_parameter_changes_nothing(api: Api, parameter: Parameter) -> None:
    given = body(api, **{parameter.name: IGNORED_SAMPLES[parameter.name]})
    assert request(api, given) == request(api, body(api))


@pytest.mark.unit
@pytest.mark.parametrize(("api", "parameter"), cases("refused"))
def test_a_refused_parameter_is_a_400_naming_it(api: Api, parameter: Parameter) -> None:
    for limits in (STRICT, LENIENT):  # lenient mode never lets a refused parameter through
        error = refusal(api, body(api, **{parameter.name: asks(api, parameter)}), limits)
        assert (error.http_status, error.param, error.code) == (400, parameter.name, "unsupported_parameter")
        assert error.to_openai()["error"]["type"] == "invalid_request_error"
        assert f"'{parameter.name}' is not supported" in error.message


@pytest.mark.unit
@pytest.mark.parametrize(("api", "parameter"), cases("refused"))
def test_a_refused_parameter_passes_when_it_asks_for_nothing(api: Api, parameter: Parameter) -> None:
    bare = request(api, body(api))
    for neutral in (None, *parameter.passes):
        assert request(api, body(api, **{parameter.name: neutral})) == bare, neutral


@pytest.mark.unit
def test_neutral_values_compare_as_json() -> None:
    best_of = parameters("completions")["best_of"]
    assert best_of.asks_for_nothing(1) and best_of.asks_for_nothing(1.0)
    assert not best_of.asks_for_nothing(True)  # true is not 1 in JSON
    assert not parameters("chat")["functions"].asks_for_nothing(0)


@pytest.mark.unit
@pytest.mark.parametrize("api", BOTH)
@pytest.mark.parametrize("name", UNKNOWN)
def test_an_unknown_field_is_a_400_unless_lenient(api: Api, name: str) -> None:
    error = refusal(api, body(api, **{name: 1}))
    assert (error.http_status, error.param, error.code) == (400, name, "unknown_parameter")
    assert repr(name) in error.message
    assert request(api, body(api, **{name: 1}), LENIENT) == request(api, body(api))
    nested = refusal(api, body(api, extra_body={name: 1}))  # nested fields count as top-level ones
    assert (nested.param, nested.code) == (name, "unknown_parameter")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("api", "name", "value"),
    [
        ("chat", "best_of", 1),
        ("chat", "prompt", "x"),
        ("chat", "echo", False),
        ("completions", "messages", MSG),
        ("completions", "tools", []),
        ("completions", "max_completion_tokens", 5),
        ("completions", "metadata", {}),
    ],
)
def test_a_parameter_of_the_other_api_is_unknown(api: Api, name: str, value: Any) -> None:
    error = refusal(api, body(api, **{name: value}))
    assert (error.param, error.code) == (name, "unknown_parameter")


@pytest.mark.unit
def test_the_first_offending_field_is_named() -> None:
    error = refusal("chat", body("chat", foo=1, functions=[TOOL["function"]]))
    assert (error.param, error.code) == ("foo", "unknown_parameter")
    error = refusal("chat", body("chat", functions=[TOOL["function"]], foo=1), LENIENT)
    assert (error.param, error.code) == ("functions", "unsupported_parameter")


@pytest.mark.unit
@pytest.mark.parametrize(("api", "model"), [("chat", ChatCompletionBody), ("completions", CompletionBody)])
def test_the_schema_and_the_table_agree(api: Api, model: type[ChatCompletionBody | CompletionBody]) -> None:
    """Every field of a body is a parameter it accepts; every supported one is a field (extra_body
    aside, which validate_body unfolds)."""
    table, fields = parameters(api), set(model.model_fields)
    assert fields <= set(table)
    assert {table[name].status for name in fields} <= {"supported", "extension", "ignored"}
    taken = {p.name for p in table.values() if p.status in ("supported", "extension")}
    assert taken - fields == {"extra_body"}


@pytest.mark.unit
def test_every_parameter_has_a_test_value_and_one_entry() -> None:
    names = [p.name for p in PARAMETERS]
    assert len(names) == len(set(names))
    by_status = {
        status: {p.name for p in PARAMETERS if p.status == status}
        for status in ("supported", "extension", "ignored", "refused")
    }
    assert by_status["supported"] | by_status["extension"] == set(EFFECTS)
    assert by_status["ignored"] == set(IGNORED_SAMPLES)
    assert by_status["refused"] == set(ASKS)


@pytest.mark.unit
def test_the_table_covers_the_openai_sdk_parameters() -> None:
    """The openai package's typed parameters are OpenAI's reference; each is in the table."""
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params

    references: tuple[tuple[Api, type], ...] = (
        ("chat", chat_create_params.CompletionCreateParamsBase),
        ("completions", completion_create_params.CompletionCreateParamsBase),
    )
    for api, params in references:
        missing = set(params.__annotations__) - set(parameters(api))
        assert missing == set(), f"{api}: {sorted(missing)}"


# The document.


def documented() -> dict[str, tuple[bool, bool, str, list[str]]]:
    """name -> (chat, completions, status, the values after "passes"), from the doc's table."""
    lines = DOC.read_text().splitlines()
    start = lines.index("| Parameter | Chat completions | Completions | Status |")
    rows: dict[str, tuple[bool, bool, str, list[str]]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        name, chat, completions, status = (cell.strip() for cell in line.strip().strip("|").split("|"))
        passes = status.partition("passes")[2].partition("(")[0]
        word = re.match(r"[a-z]+", status)
        assert word and name not in rows, line
        values = re.findall(r"`([^`]*)`", passes)
        rows[name.strip("`")] = (chat == "yes", completions == "yes", word.group(), values)
    return rows


@pytest.mark.unit
def test_the_document_lists_exactly_the_table() -> None:
    expected = {
        p.name: ("chat" in p.apis, "completions" in p.apis, p.status, [json.dumps(v) for v in p.passes])
        for p in PARAMETERS
    }
    assert documented() == expected


# Through the gateway's HTTP API.


async def post(http: httpx.AsyncClient, api: Api, fields: dict[str, Any]) -> httpx.Response:
    raw = {"model": MODEL, **({"messages": MSG} if api == "chat" else {"prompt": "hi"}), **fields}
    return await http.post(PATHS[api], json=raw)


def http_cases() -> list[tuple[Api, dict[str, Any], str | None, str | None]]:
    """(api, fields, code, param): code None means accepted."""
    accepted: list[tuple[Api, dict[str, Any], str | None, str | None]] = []
    refused: list[tuple[Api, dict[str, Any], str | None, str | None]] = []
    for p in PARAMETERS:
        for api in p.apis:
            if p.status == "refused":
                refused.append((api, {p.name: asks(api, p)}, "unsupported_parameter", p.name))
                accepted += [(api, {p.name: neutral}, None, None) for neutral in (None, *p.passes)]
            elif p.status == "ignored":
                accepted.append((api, {p.name: IGNORED_SAMPLES[p.name]}, None, None))
            elif p.name != "model":  # the fake scheduler serves MODEL only
                value = HTTP_VALUES.get(p.name, EFFECTS_ON.get((api, p.name), EFFECTS[p.name]).value)
                accepted.append((api, {**BASE_ON.get((api, p.name), {}), p.name: value}, None, None))
    unknown = [(api, {name: 1}, "unknown_parameter", name) for api in BOTH for name in UNKNOWN]
    return accepted + refused + unknown


@pytest.mark.integration
async def test_every_parameter_through_the_gateway(stack: Stack) -> None:
    wrong = []
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        for api, fields, code, param in http_cases():
            response = await post(http, api, fields)
            error = response.json()["error"] if response.status_code != 200 else {"code": None, "param": None}
            got = (response.status_code, error["code"], error["param"])
            if got != (400 if code else 200, code, param):
                wrong.append(f"{api} {fields}: {got} {response.text[:200]}")
    assert wrong == []
    accepted = sum(1 for _, _, code, _ in http_cases() if code is None)
    assert len(stack.scheduler.schedule_calls) == accepted  # no refusal reached the scheduler
    # What the worker was asked carries the supported values (here: the last max_tokens case).
    sent = [call.sampling.max_tokens for call in stack.worker.calls if call.sampling.max_tokens == 7]
    assert sent == [7, 7]  # once per API


@pytest.mark.integration
async def test_lenient_gateway_drops_unknown_fields_but_refuses_unsupported_ones(
    make_stack: StackFactory,
) -> None:
    stack = await make_stack(gateway_lenient_parameters=True)
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as http:
        for api in BOTH:
            assert (await post(http, api, {"repetition_penalty": 1.1, "guided_jsn": {}})).status_code == 200
        refused = await post(http, "chat", {"repetition_penalty": 1.1, "functions": [TOOL["function"]]})
    assert refused.status_code == 400
    assert refused.json() == {
        "error": {
            "message": "unsupported parameter: 'functions' is not supported here; leave it unset or send []",
            "type": "invalid_request_error",
            "param": "functions",
            "code": "unsupported_parameter",
        }
    }
    assert len(stack.scheduler.schedule_calls) == 2


@pytest.mark.integration
async def test_the_openai_client_sees_the_contract(stack: Stack) -> None:
    client = stack.openai()
    # What SDK users and agent frameworks send as defaults passes.
    answer = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        n=1,
        logprobs=False,
        frequency_penalty=0,
        presence_penalty=0,
        tools=[],
        tool_choice="none",
        parallel_tool_calls=False,
        response_format={"type": "text"},
        user="u",
        metadata={"k": "v"},
        store=False,
        max_tokens=2,
    )
    assert answer.choices[0].message.content == "Hello,"
    for kwargs, param, code in (
        ({"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),  # without tools
        ({"n": 9}, "n", "invalid_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),  # without logprobs: true
        ({"extra_body": {"guided_choice": []}}, "guided_choice", "invalid_value"),
        ({"extra_body": {"guided_jsn": {}}}, "guided_jsn", "unknown_parameter"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model=MODEL, messages=MSG, **kwargs  # type: ignore[arg-type]
            )
        assert (caught.value.status_code, caught.value.param, caught.value.code) == (400, param, code)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(model=MODEL, prompt="hi", echo=True)
    assert (caught.value.param, caught.value.code) == ("echo", "unsupported_parameter")
    assert len(stack.scheduler.schedule_calls) == 1


@pytest.mark.unit
def test_the_lenient_setting_reaches_the_input_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CV_GATEWAY_LENIENT_PARAMETERS", raising=False)
    assert GatewaySettings.from_env().input_limits().lenient_parameters is False
    monkeypatch.setenv("CV_GATEWAY_LENIENT_PARAMETERS", "true")
    assert GatewaySettings.from_env().input_limits() == InputLimits(lenient_parameters=True)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "asked"),
    [
        ({}, []),
        ({"n": 1, "tools": [TOOL], "tool_choice": "none", "response_format": {"type": "text"}}, []),
        ({"n": 2}, ["n"]),
        ({"tools": [TOOL]}, ["tools"]),
        ({"tools": [TOOL], "tool_choice": "none", "guided_regex": "a"}, ["guided_regex"]),
        ({"n": 3, "structured_outputs": {"choice": ["a"]}}, ["n", "structured_outputs"]),
        ({"response_format": {"type": "json_object"}}, ["response_format"]),
    ],
)
def test_structured_params_name_what_plain_sampling_cannot_serve(fields: dict[str, Any], asked: list[str]) -> None:
    """What an endpoint serving plain sampling only (a worker's own) must refuse."""
    assert validate_body(body("chat", **fields), ChatCompletionBody).structured_params() == asked
