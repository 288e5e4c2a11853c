"""The Gateway gRPC service: the same validation and pipeline as POST /v1/chat/completions.

The request is turned into the JSON shape of the HTTP body and validated by the same pydantic
model, so both edges accept and refuse exactly the same things, and are admitted by the same
``GatewayFrontend.admit`` (per-key rate limits, full-queue holds).  The API key travels in the
metadata ``authorization: Bearer <key>``; errors end the call with the code of the error
hierarchy and its ErrorDetail in the ``cv-error-bin`` trailer.

Tools, the tool choice, ``sampling.n`` and ``sampling.constraint`` map onto their HTTP fields
(``tools``, ``tool_choice``, ``n``; a constraint onto ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar``, ``structural_tag`` or a ``json_object`` response_format),
so an invalid one is refused with the message and ``param`` HTTP gives.  Streamed chunks follow
OpenAI's: each carries its choice's ``index``, and each choice ends with a chunk of its own that
holds its finish_reason.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from clairvoyant.core.errors import ClairvoyantError, InvalidRequest
from clairvoyant.core.grpc_errors import abort, status_code
from clairvoyant.core.grpcutil import SERVER_OPTIONS, add_health
from clairvoyant.core.openai_schema import ChatCompletionBody, validate_body
from clairvoyant.core.structured import ToolCall
from clairvoyant.core.telemetry import extract_context
from clairvoyant.core.wire import constraint_from_proto, tool_call_to_proto
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.metrics import REQUESTS
from clairvoyant.gateway.openai_api import to_request
from clairvoyant.gateway.request import GenerationRequest
from clairvoyant.gateway.responses import choices_of

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
# The HTTP field each OutputConstraint kind stands for (json_object: response_format's type).
_CONSTRAINT_FIELDS = {
    "json_schema": "guided_json", "regex": "guided_regex", "ebnf": "guided_grammar", "structural_tag": "structural_tag",
}  # fmt: skip
_TOOL_CHOICE_MODES = {
    common_pb2.ToolChoice.AUTO: "auto", common_pb2.ToolChoice.NONE: "none", common_pb2.ToolChoice.REQUIRED: "required",
}  # fmt: skip


def _call_json(call: common_pb2.ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _tool_json(tool: common_pb2.Tool, index: int) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "description": tool.description, "strict": tool.strict}
    if tool.parameters_json:
        param = f"tools[{index}].function.parameters"
        try:
            function["parameters"] = json.loads(tool.parameters_json)
        except ValueError:
            raise InvalidRequest(f"{param} must be a JSON object's text", param=param, code="invalid_type") from None
    return {"type": "function", "function": function}


def _tool_choice_json(choice: common_pb2.ToolChoice) -> object:
    if choice.mode == common_pb2.ToolChoice.FUNCTION:
        return {"type": "function", "function": {"name": choice.function_name}}
    return _TOOL_CHOICE_MODES[choice.mode]


def _structure_fields(request: gateway_pb2.ChatCompletionRequest) -> dict[str, Any]:
    """The HTTP fields of the request's tools, tool choice, choices and constraint."""
    fields: dict[str, Any] = {}
    if request.tools:
        fields["tools"] = [_tool_json(tool, i) for i, tool in enumerate(request.tools)]
    if request.HasField("tool_choice"):
        fields["tool_choice"] = _tool_choice_json(request.tool_choice)
    if request.HasField("parallel_tool_calls"):
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    if request.sampling.n:
        fields["n"] = request.sampling.n
    constraint = constraint_from_proto(request.sampling.constraint)
    if constraint is None:
        return fields
    if constraint.kind == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif constraint.kind == "choice":
        fields["guided_choice"] = json.loads(constraint.spec)
    else:
        fields[_CONSTRAINT_FIELDS[constraint.kind]] = constraint.spec
    return fields


def body_of(request: gateway_pb2.ChatCompletionRequest, stream: bool) -> dict[str, Any]:
    """The HTTP body this gRPC request stands for (unset optional fields left out).  Raises
    InvalidRequest for a tool whose ``parameters_json`` is not JSON."""
    messages = []
    for m in request.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.HasField("name"):
            message["name"] = m.name
        if m.tool_calls:
            message["tool_calls"] = [_call_json(call) for call in m.tool_calls]
        if m.HasField("tool_call_id"):
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": stream}
    body.update(_structure_fields(request))
    sampling = request.sampling
    for name in ("max_tokens", "temperature", "top_p", "seed", "frequency_penalty", "presence_penalty", "repetition_penalty"):
        if sampling.HasField(name):
            body[name] = getattr(sampling, name)
    if sampling.HasField("logprobs"):
        body["logprobs"], body["top_logprobs"] = True, sampling.logprobs
    if sampling.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    body["ignore_eos"] = sampling.ignore_eos
    body["min_tokens"] = sampling.min_tokens
    if request.HasField("app_metadata"):
        body["app_metadata"] = MessageToDict(request.app_metadata, preserving_proto_field_name=True)
    body["echo_annotations"] = request.echo_annotations
    return body


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, frontend: GatewayFrontend) -> None:
        self.frontend = frontend

    async def _admit(
        self, request: gateway_pb2.ChatCompletionRequest, context: grpc.aio.ServicerContext, stream: bool
    ) -> GenerationRequest:
        """Authenticate, validate and admit a call, as POST /v1/chat/completions does.  Raises
        ClairvoyantError: RateLimited or QueueFull (RESOURCE_EXHAUSTED) for a call refused as busy."""
        arrival = self.frontend.pipeline.now()
        metadata = dict(context.invocation_metadata() or ())
        authorization = metadata.get("authorization")
        authorization = authorization if isinstance(authorization, str) else None
        tenant = await self.frontend.auth.authenticate(authorization)
        body = validate_body(body_of(request, stream), ChatCompletionBody, self.frontend.settings.input_limits())
        req = to_request(
            body,
            tenant=tenant,
            endpoint="grpc",
            request_id=uuid.uuid4().hex,
            arrival_time=arrival,
            max_tokens_limit=self.frontend.settings.max_tokens_limit,
        )
        # Busy (a full queue, a rate limit) is refused here, before the pipeline spends anything;
        # the key's x-ratelimit-* values go back as initial metadata, as headers do over HTTP.
        limits = self.frontend.admit(authorization, req)
        if limits:
            await context.send_initial_metadata(tuple(limits.items()))
        return req

    async def ChatCompletion(  # noqa: N802 - gRPC method name
        self, request: gateway_pb2.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ChatCompletionResponse:
        try:
            req = await self._admit(request, context, stream=False)
            result = await self.frontend.pipeline.complete(req, extract_context(context.invocation_metadata()))
        except ClairvoyantError as err:
            REQUESTS.labels("grpc", status_code(err).name).inc()
            await abort(context, err)
        except asyncio.CancelledError:
            REQUESTS.labels("grpc", "CANCELLED").inc()
            raise
        REQUESTS.labels("grpc", "OK").inc()
        choices = [
            gateway_pb2.ChatChoice(
                index=choice.index, content=choice.text, finish_reason=choice.finish_reason,
                tool_calls=_calls(choice.tool_calls), logprobs=choice.logprobs or (),
            )
            for choice in choices_of(result)
        ]  # fmt: skip
        reply = gateway_pb2.ChatCompletionResponse(
            id=f"chatcmpl-{result.request_id}",
            model=result.model,
            created=result.created,
            content=result.text,
            finish_reason=result.finish_reason,
            usage=result.usage.to_proto(),
            logprobs=result.logprobs or (),
            tool_calls=_calls(result.tool_calls),
            choices=choices,
        )
        if req.echo_annotations:
            reply.annotations.CopyFrom(result.annotations or common_pb2.SysAnnotations())
        return reply

    async def ChatCompletionStream(  # noqa: N802 - gRPC method name
        self, request: gateway_pb2.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> None:
        try:
            req = await self._admit(request, context, stream=True)
            generation = await self.frontend.pipeline.start(req, extract_context(context.invocation_metadata()))
        except ClairvoyantError as err:
            REQUESTS.labels("grpc", status_code(err).name).inc()
            await abort(context, err)
        status = "CANCELLED"  # unless the loop below gets to the end or fails
        chunk_id = f"chatcmpl-{req.request_id}"
        model = generation.request.model  # the served model (a model group's choice)
        try:
            async for piece in generation.chunks():
                if piece.text or piece.logprobs or piece.tool_calls:
                    await context.write(
                        gateway_pb2.ChatCompletionChunk(
                            id=chunk_id, model=model, created=generation.created, index=piece.choice,
                            delta=piece.text, logprobs=piece.logprobs, tool_calls=piece.tool_calls,
                        )
                    )  # fmt: skip
                if piece.finish_reason is None:
                    continue
                last = gateway_pb2.ChatCompletionChunk(
                    id=chunk_id, model=model, created=generation.created, index=piece.choice,
                    finish_reason=piece.finish_reason or "stop",
                )  # fmt: skip
                if generation.finish_reason is not None:  # the request's last chunk
                    if request.include_usage:
                        last.usage.CopyFrom(generation.usage.to_proto())
                    if request.echo_annotations:
                        last.annotations.CopyFrom(generation.annotations or common_pb2.SysAnnotations())
                await context.write(last)
            status = "OK"
        except ClairvoyantError as err:
            status = status_code(err).name
            await abort(context, err)
        finally:
            REQUESTS.labels("grpc", status).inc()
            await generation.close()


def _calls(calls: tuple[ToolCall, ...]) -> list[common_pb2.ToolCall]:
    return [tool_call_to_proto(call) for call in calls]


def create_grpc_server(frontend: GatewayFrontend) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The gRPC server with the Gateway and grpc.health.v1 services (not started, no port yet)."""
    # A request larger than max_request_bytes is refused by gRPC itself (RESOURCE_EXHAUSTED).
    options = [o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", frontend.settings.max_request_bytes))
    server = grpc.aio.server(options=options)
    gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(frontend), server)
    health_servicer = add_health(server, [SERVICE_NAME])
    return server, health_servicer
