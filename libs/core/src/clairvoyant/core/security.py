"""One call at a service's start: its gRPC channels and servers and its NATS connection take TLS
and credentials from its settings, and the secrets among them are masked in its logs."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from clairvoyant.core.bus import NatsSecurity, configure_nats
from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.grpcutil import GrpcTls, configure_tls
from clairvoyant.core.logs import register_secrets


def configure(settings: ServiceSettings) -> GrpcTls:
    """Set the process's gRPC TLS and NATS security from ``settings`` and return the former (for
    ``grpcutil.bind``).  Reads the certificate and key files now: a missing one stops the start."""
    tls = configure_tls(GrpcTls.from_settings(settings))
    nats = configure_nats(NatsSecurity.from_settings(settings))
    register_secrets(nats.secrets())
    register_secrets(url_passwords(settings))
    for key_file in (settings.grpc_tls_key, settings.grpc_tls_client_key, settings.nats_tls_key):
        if key_file:
            register_secrets(_pem_body(Path(key_file).read_text()))
    return tls


def url_passwords(settings: ServiceSettings) -> list[str]:
    """The passwords inside the settings' URLs (``nats_url``, ``database_url``, ...)."""
    passwords = []
    for name, value in settings:
        if name.endswith("_url") and isinstance(value, str):
            for url in value.split(","):  # NATS takes a comma-separated list of servers
                try:
                    parts = urlsplit(url.strip())
                except ValueError:
                    continue
                passwords.append(parts.password or (parts.username if parts.scheme in ("nats", "tls") else None))
    return [p for p in passwords if p]


def _pem_body(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("-----")]
