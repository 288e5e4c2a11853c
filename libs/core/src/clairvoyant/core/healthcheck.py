"""The container health probe of the gRPC services: grpc.health.v1 over the service's own TLS.

A Dockerfile's HEALTHCHECK calls ``grpc_health_serving`` with the service's address; the probe
dials it as the service's clients do (``CV_GRPC_TLS*``: plaintext by default, TLS and a client
certificate when the service requires them), so a service serving TLS is not reported unhealthy.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.grpcutil import GrpcTls, sync_channel


def grpc_health_serving(address: str, timeout_s: float = 2.0, tls: GrpcTls | None = None) -> bool:
    """Whether the server at ``address`` reports SERVING; ``tls`` defaults to the ``CV_GRPC_TLS*``
    settings of this environment.  False, never an exception, when it cannot be asked."""
    try:
        if tls is None:  # the CV_* settings of this environment, as the service reads them
            tls = GrpcTls.from_settings(ServiceSettings(**{}))
        with sync_channel(address, tls) as chan:
            reply = health_pb2_grpc.HealthStub(chan).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
    except (grpc.RpcError, OSError, ValueError):
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
