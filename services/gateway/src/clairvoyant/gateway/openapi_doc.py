"""What /openapi.json says beyond FastAPI's defaults: the request bodies, which the handlers read
raw (so FastAPI cannot see them), and the OpenAI error object of every refusal."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from clairvoyant.core.openai_output import ErrorOut

SCHEMA_REF = "#/components/schemas/{model}"
ERRORS = {
    400: "Invalid request: a parameter, the JSON, its encoding, or an input limit (`error.param` names it)",
    401: "Missing or unknown API key",
    404: "No such model",
    413: "The body is larger than CV_MAX_REQUEST_BYTES",
    429: "The model's queue is full; retry after `Retry-After` seconds",
    500: "Internal error",
    503: "No worker serves the model, or a dependency is unavailable",
}
Responses = dict[int | str, dict[str, Any]]

def error_responses(*statuses: int) -> Responses:
    """``responses=`` for a route that may answer these statuses with an OpenAI error object."""
    return {status: {"model": ErrorOut, "description": ERRORS[status]} for status in statuses}


def generated(model: type[BaseModel]) -> Responses:
    """``responses=`` for a generation route's 200: ``model`` as JSON, or its chunks as server-sent
    events when the request set ``stream``."""
    events = {"schema": {"type": "string", "description": "data: <chunk JSON> lines, then data: [DONE]"}}
    return {200: {"model": model, "content": {"text/event-stream": events}, "description": "The answer"}}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads ``model`` from a raw JSON body."""
    schema = {"$ref": SCHEMA_REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def add_body_schemas(document: dict[str, Any], models: tuple[type[BaseModel], ...]) -> None:
    """Put the JSON schemas of the body ``models`` (and of the models they use) in the document's
    components, where ``json_body`` points.  The bodies admit no other top-level field: the gateway
    refuses unknown ones (docs/openai-api.md; CV_GATEWAY_LENIENT_PARAMETERS relaxes that)."""
    _, schemas = models_json_schema([(model, "validation") for model in models], ref_template=SCHEMA_REF)
    components = document.setdefault("components", {}).setdefault("schemas", {})
    bodies = {model.__name__ for model in models}
    for name, schema in schemas.get("$defs", {}).items():
        if name in bodies:
            schema = {**schema, "additionalProperties": False}
        components.setdefault(name, schema)
