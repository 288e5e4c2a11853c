"""Profiler settings (environment prefix ``CV_``, e.g. ``CV_PROFILER_PORT``)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from clairvoyant.core.config import ServiceSettings
from clairvoyant.profiler.core import ConfidenceConfig, ProfileConfig, SynthesisConfig
from clairvoyant.profiler.core.agent_names import AgentNameConfig, compile_pattern
from clairvoyant.profiler.core.priors import PriorConfig


class ProfilerSettings(ServiceSettings):
    profiler_port: int = Field(50052, ge=0, le=65535, description="gRPC port; 0 picks a free one")
    metrics_port: int = Field(9102, ge=0, le=65535, description="Prometheus /metrics; 0 disables")
    database_url: str = Field(
        "sqlite:///var/profiler.db", description="where profiles persist (SQLAlchemy URL: SQLite or PostgreSQL)"
    )
    # The learning model (clairvoyant.profiler.core.ProfileConfig).
    idle_timeout_s: float = Field(600.0, gt=0, description="an instance silent this long is closed")
    min_instances: int = Field(30, ge=1, description="closed instances before a profile leaves shadow")
    high_instances: int = Field(100, ge=1, description="closed instances before confidence can be high")
    require_convergence: bool = Field(
        True, description="false: a profile leaves shadow on min_instances alone, converged or not"
    )
    prune_threshold: float = Field(
        0.05, ge=0, lt=1, description="transitions taken by fewer of the traces are pruned"
    )
    resynthesize_every: int = Field(20, ge=1, description="closed instances between path re-synthesis")
    max_traces: int = Field(500, ge=1, description="recent traces each synthesis learns from")
    # Agents named per task (core/agent_names.py, core/priors.py).
    agent_name_pattern: str = Field(
        "", description="regex over agent ids: group 1 becomes the name, or each match the replacement; empty: off"
    )
    agent_name_replacement: str = Field(
        "+", description="what each match of agent_name_pattern becomes when it has no capture group"
    )
    agent_prompt_prefix_blocks: int = Field(
        0, ge=0, le=4096, description="agents whose prompts share this many leading 16-token blocks share a name; 0: off"
    )
    length_prior: bool = Field(
        True, description="agents with few calls get a length interval shrunk toward their position's pooled calls"
    )
    # Serving (applies to restored profiles too).
    profiler_projection_steps: int = Field(
        8, ge=0, le=64, description="steps after a request's own whose expected calls per agent it is annotated with"
    )
    # The JetStream consumer of cv.requests.completed.
    consumer_name: str = Field("profiler", min_length=1, description="durable JetStream consumer name")
    batch_size: int = Field(256, ge=1, le=10_000, description="records fetched, applied and acked together")
    fetch_timeout_s: float = Field(1.0, gt=0, description="longest wait for a batch")
    ack_wait_s: float = Field(60.0, gt=0, description="unacked records are redelivered after this long")
    tick_interval_s: float = Field(5.0, gt=0, description="how often idle instances are looked for")
    retry_interval_s: float = Field(1.0, gt=0, description="pause after a NATS or database failure")
    # Persistence: every batch appends its records to a log; a profile's whole state is written
    # (a snapshot, which prunes the log rows it covers) only this often, and on shutdown.
    snapshot_interval_s: float = Field(
        60.0, gt=0, description="a profile with changes not in its snapshot is snapshotted at least this often"
    )
    snapshot_every_records: int = Field(
        20_000, ge=1, description="log entries of one profile that trigger its snapshot (bounds replay on start)"
    )
    shutdown_grace_s: float = Field(5.0, ge=0, description="in-flight RPCs get this long on SIGTERM")

    @field_validator("database_url")
    @classmethod
    def _parsable_url(cls, value: str) -> str:
        try:  # fail at start on a malformed URL, not at the first write
            make_url(value)
        except ArgumentError as exc:  # a ValueError is what pydantic turns into a ValidationError
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _agent_names_compile(self) -> ProfilerSettings:
        compile_pattern(self._agent_names())  # fail at start, not at the first profile
        return self

    def _agent_names(self) -> AgentNameConfig:
        return AgentNameConfig(
            pattern=self.agent_name_pattern,
            replacement=self.agent_name_replacement,
            prompt_prefix_blocks=self.agent_prompt_prefix_blocks,
        )

    def profile_config(self) -> ProfileConfig:
        return ProfileConfig(
            idle_timeout_s=self.idle_timeout_s,
            resynthesize_every=self.resynthesize_every,
            max_traces=self.max_traces,
            projection_steps=self.profiler_projection_steps,
            synthesis=SynthesisConfig(prune_threshold=self.prune_threshold),
            confidence=ConfidenceConfig(
                min_instances=self.min_instances,
                high_instances=self.high_instances,
                require_convergence=self.require_convergence,
            ),
            agent_names=self._agent_names(),
            priors=PriorConfig(enabled=self.length_prior),
        )
