"""Scheduler settings (environment prefix ``CV_``, e.g. ``CV_SCHEDULER_PORT``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from clairvoyant.core.config import ServiceSettings
from clairvoyant.policy import PRESETS


class SchedulerSettings(ServiceSettings):
    scheduler_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(9101, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    policy: str = Field("fcfs-rr", description="scheduler preset: " + ", ".join(PRESETS.names()))
    model_groups: Path | None = Field(
        None,
        description="model groups (YAML or JSON; clairvoyant.core.model_groups): names a request may send "
        "as its model for the scheduler to choose the served model per call; needs a preset that "
        "chooses models (aragog, aragog-per-input, aragog-per-workflow)",
    )
    max_queue_per_model: int = Field(
        1024, ge=1, description="requests waiting per model before RESOURCE_EXHAUSTED"
    )
    queue_retry_after_s: float = Field(1.0, ge=0, description="retry hint sent with a full-queue rejection")
    heartbeat_timeout_factor: float = Field(
        3.0, gt=0, description="a worker silent this many intervals is removed"
    )
    default_heartbeat_interval_s: float = Field(1.0, gt=0, description="for workers that report no interval")
    expiry_interval_s: float = Field(0.5, gt=0, description="how often silent workers are looked for")
    shutdown_grace_s: float = Field(5.0, ge=0, description="in-flight RPCs get this long on SIGTERM")
    kv_migration_timeout_s: float = Field(
        2.0,
        ge=0,
        description="longest a placement waits for its session's KV to move (saga's steals); "
        "past it, or when the move fails, the call recomputes the prefix.  0 turns moving off",
    )
    kv_speculative_ttl_s: float = Field(
        2.0,
        ge=0,
        description="a placement marks its prompt's blocks as held on its worker this long, until the "
        "worker's KV events confirm them (cache-aware routing); 0 turns it off",
    )

    placement_lease_s: float = Field(
        30.0, gt=0, description="a placement whose owner (a gateway) stops renewing it is reclaimed after this long"
    )
    reconcile_grace_s: float = Field(
        5.0,
        ge=0,
        description="a placement its worker still does not report holding this long after it was made "
        "(in two reports in a row) is reclaimed",
    )
    worker_probe_timeout_s: float = Field(
        1.0,
        ge=0,
        description="a worker whose heartbeats stop is asked for its stats over gRPC, with this deadline, "
        "before it is expired; 0 expires on silence alone",
    )

    @field_validator("model_groups", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value  # CV_MODEL_GROUPS= (compose's default) declares none

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(
                f"unknown scheduler policy {value!r}; choose one of: {', '.join(PRESETS.names())}"
            )
        return value
