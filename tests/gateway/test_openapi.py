"""/openapi.json: the request bodies the handlers read raw, and the OpenAI error object of every
refusal, described so that clients and fuzzers can use the document."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Stack
from tests.gateway.fakes import MODEL

pytestmark = pytest.mark.integration

ERROR_STATUSES = ("400", "401", "404", "413", "429", "500", "503")


def resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    prefix = "#/components/schemas/"
    ref = schema.get("$ref")
    if ref is None:
        return schema
    assert ref.startswith(prefix), ref
    return document["components"]["schemas"][ref.removeprefix(prefix)]


def refs(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    return []


async def openapi(stack: Stack) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.get("/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


@pytest.mark.parametrize(
    ("path", "required", "success"),
    [
        ("/v1/chat/completions", {"model", "messages"}, "ChatCompletionOut"),
        ("/v1/completions", {"model", "prompt"}, "TextCompletionOut"),
    ],
)
async def test_generation_routes_document_body_and_errors(
    stack: Stack, path: str, required: set[str], success: str
) -> None:
    document = await openapi(stack)
    operation = document["paths"][path]["post"]
    request_body = operation["requestBody"]
    assert request_body["required"] is True
    body = resolve(document, request_body["content"]["application/json"]["schema"])
    assert set(body["required"]) == required
    assert {"temperature", "max_tokens", "stop", "stream", "app_metadata"} <= set(body["properties"])
    assert body["properties"]["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}

    responses = operation["responses"]
    assert set(responses) == {"200", *ERROR_STATUSES}
    ok = responses["200"]["content"]
    assert resolve(document, ok["application/json"]["schema"])["title"] == success
    assert "text/event-stream" in ok
    for status in ERROR_STATUSES:
        error = resolve(document, responses[status]["content"]["application/json"]["schema"])
        assert error["required"] == ["error"], status
        fields = resolve(document, error["properties"]["error"])
        assert set(fields["required"]) == {"message", "type", "param", "code"}, status
        assert responses[status]["description"], status


async def test_chat_body_schema_spells_out_messages(stack: Stack) -> None:
    document = await openapi(stack)
    body = document["components"]["schemas"]["ChatCompletionBody"]
    messages = body["properties"]["messages"]
    assert messages["minItems"] == 1
    message = resolve(document, messages["items"])
    assert message["required"] == ["role"]
    assert set(message["properties"]["role"]["enum"]) == {"system", "user", "assistant", "tool", "developer"}
    content_kinds = [kind.get("type") for kind in message["properties"]["content"]["anyOf"]]
    assert content_kinds == ["string", "array", "null"]


async def test_models_route_and_every_reference_resolves(stack: Stack) -> None:
    document = await openapi(stack)
    models = document["paths"]["/v1/models"]["get"]["responses"]
    assert set(models) == {"200", "401", "500", "503"}
    assert resolve(document, models["200"]["content"]["application/json"]["schema"])["title"] == "ModelList"
    schemas = document["components"]["schemas"]
    dangling = {r for r in refs(document) if r.removeprefix("#/components/schemas/") not in schemas}
    assert dangling == set()
    assert len(refs(document)) > 20


async def test_a_refusal_matches_the_documented_error_object(stack: Stack) -> None:
    document = await openapi(stack)
    error_object = document["components"]["schemas"]["ErrorObject"]
    async with httpx.AsyncClient(base_url=stack.url) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": ""})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == set(error_object["properties"]) == set(error_object["required"])
    assert error["param"] == "prompt"
