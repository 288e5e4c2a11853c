"""Settings shared by every service.  Each service extends ``ServiceSettings`` in its config.py.

Values come from the environment (prefix ``CV_``) with defaults that work for ``make run``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CV_", extra="ignore")

    nats_url: str = Field(DEFAULT_NATS_URL, description="NATS server; the stack launcher sets it")
    nats_connect_timeout_s: float = Field(2.0, gt=0)
    log_level: str = "INFO"
    log_json: bool = True
    host: str = Field("127.0.0.1", description="interface the service binds to (0.0.0.0 in containers)")
    advertise_host: str = Field("", description="host other services use to reach this one (default: host)")

    def advertised(self) -> str:
        if self.advertise_host:
            return self.advertise_host
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
