"""gRPC plumbing shared by the services: health, error mapping and trace-context propagation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from clairvoyant.core.errors import ERROR_TRAILER, ClairvoyantError

# Keep-alives so a dead peer is noticed in seconds, not at the next TCP timeout.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def add_health(server: grpc.aio.Server, service_names: Iterable[str]) -> health.aio.HealthServicer:
    """Register grpc.health.v1 with every named service (and the overall "") SERVING."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def mark_serving(servicer: health.aio.HealthServicer, service_names: Iterable[str], serving: bool = True) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *service_names]:
        await servicer.set(name, status)


async def abort(context: grpc.aio.ServicerContext, err: ClairvoyantError) -> NoReturn:
    """End the call with ``err``'s status code and its ErrorDetail in the ``cv-error-bin`` trailer."""
    context.set_trailing_metadata(((ERROR_TRAILER, err.to_detail().SerializeToString()),))
    await context.abort(err.grpc_code, err.message)
    raise AssertionError("unreachable")  # context.abort raises


# Servers must accept the clients' keep-alive pings, even on idle connections, or they answer
# with GOAWAY "too_many_pings" and the connection is torn down.
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def new_server() -> grpc.aio.Server:
    return grpc.aio.server(options=SERVER_OPTIONS)


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
