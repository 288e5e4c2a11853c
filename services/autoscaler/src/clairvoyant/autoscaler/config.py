"""Autoscaler settings (environment prefix ``CV_``, e.g. ``CV_AUTOSCALER_PORT``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, field_validator

from clairvoyant.core.config import ServiceSettings
from clairvoyant.policy import SCALING_POLICIES


class ProfileOverride(BaseModel):
    """One model's serving profile; what is unset comes from its workers or the defaults."""

    gpus_per_replica: int | None = Field(None, ge=1)
    calls_per_replica: float | None = Field(None, gt=0)
    startup_s: float | None = Field(None, ge=0)
    prefill_tokens_per_s: float | None = Field(None, gt=0)
    decode_step_s: float | None = Field(None, gt=0)
    min_replicas: int | None = Field(None, ge=0)
    max_replicas: int | None = Field(None, ge=0)


class AutoscalerSettings(ServiceSettings):
    autoscaler_port: int = Field(50054, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(9104, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    scheduler_address: str = Field("127.0.0.1:50051", description="the scheduler's gRPC address")
    scaling_policy: str = Field(
        "pythia", description="scaling policy: " + ", ".join(SCALING_POLICIES.names())
    )
    horizon_steps: int = Field(2, ge=0, description="pythia: the look-ahead horizon H, in workflow steps")
    interval_s: float = Field(5.0, gt=0, description="seconds between two ticks of the scaling loop")
    gpu_budget: int = Field(
        8, ge=1, description="GPUs all replicas may hold together (starting and draining too)"
    )
    models: str = Field(
        "", description="comma-separated models to manage; empty: every model a worker or queue shows"
    )
    profiles: str = Field(
        "",
        description='JSON per-model profile overrides, e.g. {"llama-3.1-8b": {"gpus_per_replica": 1, '
        '"calls_per_replica": 64, "startup_s": 30}}',
    )
    default_startup_s: float = Field(
        30.0, ge=0, description="a model's cold start when its profile names none"
    )
    startup_allowance_s: float = Field(
        300.0, gt=0, description="a replica not ready this long after it was started is torn down and counted"
    )
    actuator: str = Field("local", description="how replicas start and stop: local | docker | kubernetes")
    actuator_options: str = Field(
        "",
        description='JSON keyword options of the actuator, e.g. {"image": "clairvoyant-worker:dev"} (docker) '
        'or {"namespace": "clairvoyant"} (kubernetes)',
    )
    worker_env: str = Field(
        "",
        description='JSON environment of the workers it starts (local, docker), e.g. {"CV_RUNNER": "emulated"}',
    )
    actuator_retries: int = Field(5, ge=0, description="retries of a failed start or stop, with backoff")
    actuator_backoff_s: float = Field(1.0, gt=0, description="first retry delay; doubles up to 30 s")
    rpc_timeout_s: float = Field(2.0, gt=0, description="deadline of each call to the scheduler, and of the Drain sent to a worker")

    @field_validator("scaling_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in SCALING_POLICIES:
            raise ValueError(
                f"unknown scaling policy {value!r}; choose one of: {', '.join(SCALING_POLICIES.names())}"
            )
        return value

    @field_validator("profiles")
    @classmethod
    def _valid_profiles(cls, value: str) -> str:
        parse_profiles(value)
        return value

    @field_validator("actuator_options", "worker_env")
    @classmethod
    def _json_object(cls, value: str) -> str:
        if value.strip():
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise ValueError("must be a JSON object")
        return value

    def managed_models(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]

    def profile_overrides(self) -> dict[str, ProfileOverride]:
        return parse_profiles(self.profiles)


def parse_profiles(text: str) -> dict[str, ProfileOverride]:
    """``CV_PROFILES`` as overrides per model.  Raises ValueError naming what is wrong."""
    if not text.strip():
        return {}
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"CV_PROFILES is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("CV_PROFILES must be a JSON object of model -> profile")
    return {str(model): ProfileOverride.model_validate(fields) for model, fields in raw.items()}
