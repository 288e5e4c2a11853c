"""Cache manager settings (environment prefix ``CV_``, e.g. ``CV_CACHEMGR_PORT``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from clairvoyant.cachemgr.core import CoreConfig
from clairvoyant.core.config import ServiceSettings
from clairvoyant.policy import CACHE_POLICIES, PRESETS


class CacheManagerSettings(ServiceSettings):
    cachemgr_port: int = Field(50053, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(9103, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    cachemgr_preset: str = Field(
        "clairvoyant", description="the preset whose cache policy runs unless cachemgr_policy names one"
    )
    cachemgr_policy: str = Field(
        "",
        description="a cache policy by name (overrides the preset's): " + ", ".join(CACHE_POLICIES.names()),
    )
    cachemgr_tick_interval_s: float = Field(
        1.0, gt=0, description="how often TTLs, idle workflows and silent workers are looked at"
    )
    cachemgr_history_max_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="token ids held as workflow history, all tenants together"
    )
    cachemgr_max_index_entries: int = Field(
        2_000_000, ge=1, description="(worker, tier, block) entries the index holds at most (~650 bytes each)"
    )
    cachemgr_workflow_idle_ttl_s: float = Field(
        600.0, gt=0, description="a workflow without a call this long is forgotten"
    )
    cachemgr_speculative_ttl_s: float = Field(
        2.0,
        ge=0,
        description="a placement's blocks count as held until the worker's event, at most this long",
    )
    cachemgr_cross_tenant_sharing: bool = Field(
        False, description="one tenant's cached blocks count as another's (never for untrusted tenants)"
    )
    # The durable JetStream consumer of cv.requests.completed.
    cachemgr_consumer_name: str = Field(
        "cachemgr", min_length=1, description="durable JetStream consumer name"
    )
    cachemgr_batch_size: int = Field(
        256, ge=1, le=10_000, description="completion records fetched and acked together"
    )
    cachemgr_fetch_timeout_s: float = Field(1.0, gt=0, description="longest wait for a batch of records")
    cachemgr_ack_wait_s: float = Field(
        30.0, gt=0, description="unacked records are redelivered after this long"
    )
    cachemgr_retry_interval_s: float = Field(
        1.0, gt=0, description="first pause after a NATS failure; doubles up to 30 s"
    )
    cachemgr_directive_timeout_s: float = Field(
        2.0, gt=0, description="how long a worker gets to answer a batch of directives (never retried)"
    )
    shutdown_grace_s: float = Field(2.0, ge=0, description="in-flight RPCs get this long on SIGTERM")

    @model_validator(mode="after")
    def _known_policy(self) -> CacheManagerSettings:
        """Fail at start, naming the choices, for a preset or policy nobody registered."""
        if self.cachemgr_policy:
            if self.cachemgr_policy not in CACHE_POLICIES:
                raise ValueError(
                    f"CV_CACHEMGR_POLICY: unknown cache policy {self.cachemgr_policy!r}; "
                    f"choose one of: {', '.join(CACHE_POLICIES.names())}"
                )
        elif self.cachemgr_preset not in PRESETS:
            raise ValueError(
                f"CV_CACHEMGR_PRESET: unknown preset {self.cachemgr_preset!r}; "
                f"choose one of: {', '.join(PRESETS.names())}"
            )
        return self

    def policy_name(self) -> str:
        """The cache policy in force: ``cachemgr_policy``, else the preset's."""
        return self.cachemgr_policy or PRESETS.create(self.cachemgr_preset).cache

    def core_config(self) -> CoreConfig:
        return CoreConfig(
            speculative_ttl_s=self.cachemgr_speculative_ttl_s,
            history_max_bytes=self.cachemgr_history_max_bytes,
            max_index_entries=self.cachemgr_max_index_entries,
            workflow_idle_ttl_s=self.cachemgr_workflow_idle_ttl_s,
            cross_tenant_sharing=self.cachemgr_cross_tenant_sharing,
        )
