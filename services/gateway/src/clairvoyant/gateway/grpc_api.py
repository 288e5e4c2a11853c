"""The Gateway gRPC service: the same validation and pipeline as POST /v1/chat/completions.

The request is turned into the JSON shape of the HTTP body and validated by the same pydantic
model, so both edges accept and refuse exactly the same things, and are admitted by the same
``GatewayFrontend.admit`` (per-key rate limits, full-queue holds).  The API key travels in the
metadata ``authorization: Bearer <key>``; errors end the call with the code of the error
hierarchy and its ErrorDetail in the ``cv-error-bin`` trailer.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health

from clairvoyant.contracts.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from clairvoyant.core.errors import ClairvoyantError
from clairvoyant.core.grpc_errors import abort, status_code
from clairvoyant.core.grpcutil import SERVER_OPTIONS, add_health
from clairvoyant.core.openai_schema import ChatCompletionBody, validate_body
from clairvoyant.core.telemetry import extract_context
from clairvoyant.gateway.frontend import GatewayFrontend
from clairvoyant.gateway.metrics import REQUESTS
from clairvoyant.gateway.openai_api import to_request
from clairvoyant.gateway.request import GenerationRequest

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name


def body_of(request: gateway_pb2.ChatCompletionRequest, stream: bool) -> dict[str, Any]:
    """The HTTP body this gRPC request stands for (unset optional fields left out)."""
    messages = []
    for m in request.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.HasField("name"):
            message["name"] = m.name
        messages.append(message)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": stream}
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
        reply = gateway_pb2.ChatCompletionResponse(
            id=f"chatcmpl-{result.request_id}",
            model=result.model,
            created=result.created,
            content=result.text,
            finish_reason=result.finish_reason,
            usage=result.usage.to_proto(),
            logprobs=result.logprobs or (),
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
        try:
            async for text, logprobs in generation.pieces():
                await context.write(
                    gateway_pb2.ChatCompletionChunk(
                        id=chunk_id, model=generation.request.model, created=generation.created, delta=text,
                        logprobs=logprobs,
                    )
                )  # fmt: skip
            last = gateway_pb2.ChatCompletionChunk(
                id=chunk_id,
                model=generation.request.model,  # the served model (a model group's choice)
                created=generation.created,
                finish_reason=generation.finish_reason or "stop",
            )
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


def create_grpc_server(frontend: GatewayFrontend) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The gRPC server with the Gateway and grpc.health.v1 services (not started, no port yet)."""
    # A request larger than max_request_bytes is refused by gRPC itself (RESOURCE_EXHAUSTED).
    options = [o for o in SERVER_OPTIONS if o[0] != "grpc.max_receive_message_length"]
    options.append(("grpc.max_receive_message_length", frontend.settings.max_request_bytes))
    server = grpc.aio.server(options=options)
    gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(frontend), server)
    health_servicer = add_health(server, [SERVICE_NAME])
    return server, health_servicer
