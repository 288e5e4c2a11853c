"""gRPC plumbing shared by the services: health, channel and server options, and TLS (errors:
``grpc_errors``).

TLS: ``bind`` and ``channel`` take a ``GrpcTls``; without one they use the process's, which a
service sets once at start (``configure_tls``) and which is plaintext until then.  So call sites
that predate TLS (``channel(address)``) follow the service's settings unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from clairvoyant.core.config import ServiceSettings

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


# Servers must accept the clients' keep-alive pings, even on idle connections, or they answer
# with GOAWAY "too_many_pings" and the connection is torn down.
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    # gRPC sets SO_REUSEPORT by default: a second server on a port in use would silently share its
    # traffic, and a bind to port 0 can be handed a port another server of this user still holds.
    ("grpc.so_reuseport", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


@dataclass(frozen=True)
class GrpcTls:
    """How this process serves and dials gRPC.  ``GrpcTls()`` is plaintext.

    Holds the PEM contents, read at start-up (``from_settings``), so a missing file stops the
    service there and not at its first call.  Private keys stay out of ``repr``.
    """

    enabled: bool = False
    certificate_chain: bytes | None = None  # what this service's server presents
    private_key: bytes | None = field(default=None, repr=False)
    root_certificates: bytes | None = None  # verifies servers, and clients under client_auth; None: system roots
    client_auth: bool = False  # servers refuse clients without a certificate signed by root_certificates
    client_certificate_chain: bytes | None = None  # shown to servers that ask; None: certificate_chain
    client_private_key: bytes | None = field(default=None, repr=False)
    server_name: str = ""  # expected in servers' certificates instead of the dialled host

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> GrpcTls:
        if not settings.grpc_tls:
            return cls()
        return cls(
            enabled=True,
            certificate_chain=_read(settings.grpc_tls_cert),
            private_key=_read(settings.grpc_tls_key),
            root_certificates=_read(settings.grpc_tls_ca),
            client_auth=settings.grpc_tls_client_auth,
            client_certificate_chain=_read(settings.grpc_tls_client_cert),
            client_private_key=_read(settings.grpc_tls_client_key),
            server_name=settings.grpc_tls_server_name,
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.certificate_chain is None or self.private_key is None:
            raise ValueError("serving gRPC with TLS needs a certificate and key (CV_GRPC_TLS_CERT, CV_GRPC_TLS_KEY)")
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.root_certificates,
            require_client_auth=self.client_auth,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        chain: bytes | None
        key: bytes | None
        if self.client_certificate_chain is not None:
            chain, key = self.client_certificate_chain, self.client_private_key
        else:
            chain, key = self.certificate_chain, self.private_key
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates, private_key=key, certificate_chain=chain
        )

    def channel_options(self) -> list[tuple[str, str | int]]:
        if self.enabled and self.server_name:
            return [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", self.server_name)]
        return list(CHANNEL_OPTIONS)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


_process_tls = GrpcTls()


def configure_tls(tls: GrpcTls) -> GrpcTls:
    """Make ``tls`` what ``bind`` and ``channel`` use when given none; returns it.  Called once at
    a service's start, before it opens channels."""
    global _process_tls
    _process_tls = tls
    return tls


def process_tls() -> GrpcTls:
    return _process_tls


def new_server() -> grpc.aio.Server:
    return grpc.aio.server(options=SERVER_OPTIONS)


def bind(server: grpc.aio.Server, address: str, tls: GrpcTls | None = None) -> int:
    """Listen on ``address`` ("host:port"; port 0 picks one) with TLS when ``tls`` (default: the
    process's) is enabled; returns the bound port."""
    tls = tls if tls is not None else _process_tls
    if tls.enabled:
        return server.add_secure_port(address, tls.server_credentials())
    return server.add_insecure_port(address)


def channel(address: str, tls: GrpcTls | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``address``, with TLS when ``tls`` (default: the process's) is enabled."""
    tls = tls if tls is not None else _process_tls
    if tls.enabled:
        return grpc.aio.secure_channel(address, tls.channel_credentials(), options=tls.channel_options())
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


def sync_channel(address: str, tls: GrpcTls | None = None) -> grpc.Channel:
    """The blocking counterpart of ``channel``, for launchers and command-line tools."""
    tls = tls if tls is not None else _process_tls
    if tls.enabled:
        return grpc.secure_channel(address, tls.channel_credentials(), options=tls.channel_options())
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
