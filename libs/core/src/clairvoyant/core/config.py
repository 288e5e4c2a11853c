"""Settings shared by every service.  Each service extends ``ServiceSettings`` in its config.py.

Values come from the environment (prefix ``CV_``) with defaults that work for ``make run``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


class ServiceSettings(BaseSettings):
    # Errors name the variable but never echo values: a bad setting must not print a password.
    model_config = SettingsConfigDict(env_prefix="CV_", extra="ignore", hide_input_in_errors=True)

    nats_url: str = Field(DEFAULT_NATS_URL, description="NATS server; the stack launcher sets it")
    nats_connect_timeout_s: float = Field(2.0, gt=0)
    log_level: str = "INFO"
    log_json: bool = True
    host: str = Field("127.0.0.1", description="interface the service binds to (0.0.0.0 in containers)")
    advertise_host: str = Field("", description="host other services use to reach this one (default: host)")

    # gRPC between services (grpcutil.GrpcTls).  Paths name PEM files, read once at start-up.
    grpc_tls: bool = Field(False, description="serve gRPC with TLS and connect to other services with TLS")
    grpc_tls_cert: str = Field("", description="certificate chain this service's gRPC server presents")
    grpc_tls_key: str = Field("", description="private key of grpc_tls_cert")
    grpc_tls_ca: str = Field(
        "", description="CA bundle that verifies servers, and clients under client auth; empty: system roots"
    )
    grpc_tls_client_auth: bool = Field(False, description="servers require a client certificate (mTLS)")
    grpc_tls_client_cert: str = Field("", description="certificate shown to servers; empty: grpc_tls_cert")
    grpc_tls_client_key: str = Field("", description="private key of grpc_tls_client_cert")
    grpc_tls_server_name: str = Field("", description="name expected in servers' certificates; empty: the host")

    # NATS credentials and TLS (bus.NatsSecurity).  A user and password may also sit in nats_url.
    nats_user: str = Field("", description="NATS user (with nats_password)")
    nats_password: SecretStr | None = Field(None, description="NATS password")
    nats_token: SecretStr | None = Field(None, description="NATS authentication token")
    nats_nkey_seed_file: str = Field("", description="file holding an nkeys user seed (SU...)")
    nats_creds_file: str = Field("", description="NATS credentials file (user JWT and nkeys seed)")
    nats_tls_ca: str = Field("", description="CA bundle that verifies the NATS server; empty: system roots")
    nats_tls_cert: str = Field("", description="client certificate for servers that verify clients")
    nats_tls_key: str = Field("", description="private key of nats_tls_cert")
    nats_tls_server_name: str = Field("", description="name expected in the server's certificate")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ServiceSettings:
        """The settings a child process given ``environ`` would read (launchers use it)."""
        names = {f"CV_{name.upper()}": name for name in cls.model_fields}
        values: dict[str, Any] = {names[key.upper()]: value for key, value in environ.items() if key.upper() in names}
        return cls(**values)

    def advertised(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    @model_validator(mode="after")
    def _check_security(self) -> ServiceSettings:
        """Half-configured security is a start-up error, not a silent fallback to plaintext."""
        pairs = [("grpc_tls_cert", "grpc_tls_key"), ("grpc_tls_client_cert", "grpc_tls_client_key"),
                 ("nats_tls_cert", "nats_tls_key")]
        for cert, key in pairs:
            if bool(getattr(self, cert)) != bool(getattr(self, key)):
                raise ValueError(f"CV_{cert.upper()} and CV_{key.upper()} must be set together")
        if self.grpc_tls and not self.grpc_tls_cert:
            raise ValueError("CV_GRPC_TLS needs CV_GRPC_TLS_CERT and CV_GRPC_TLS_KEY (every service serves gRPC)")
        if self.grpc_tls_client_auth and not (self.grpc_tls and self.grpc_tls_ca):
            raise ValueError("CV_GRPC_TLS_CLIENT_AUTH needs CV_GRPC_TLS=true and CV_GRPC_TLS_CA")
        if bool(self.nats_user) != bool(self.nats_password and self.nats_password.get_secret_value()):
            raise ValueError("CV_NATS_USER and CV_NATS_PASSWORD must be set together")
        return self
