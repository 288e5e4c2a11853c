"""Gateway settings (environment prefix ``CV_``), on top of the shared ``ServiceSettings``."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from sqlalchemy.engine import make_url

from clairvoyant.core.app_metadata import ID_PATTERN, ID_RULE
from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.openai_schema import DEFAULT_LIMITS, InputLimits
from clairvoyant.gateway.sessions import SessionTagging


class GatewaySettings(ServiceSettings):
    gateway_port: int = Field(
        default=8000, ge=0, le=65535, description="OpenAI-compatible HTTP API; 0 picks a free port"
    )
    gateway_grpc_port: int = Field(
        default=50050, ge=0, le=65535, description="Gateway gRPC service; 0 picks a free port"
    )
    scheduler_address: str = Field(
        default="127.0.0.1:50051", min_length=1, description="host:port of the scheduler"
    )
    profiler_address: str = Field(
        default="", description="host:port of the profiler; empty: requests go un-annotated"
    )
    profiler_timeout_s: float = Field(
        default=0.005,
        gt=0,
        description="Annotate deadline (5 ms); past it the request goes on un-annotated",
    )
    database_url: str = Field(default="sqlite:///var/gateway.db", description="API keys (SQLAlchemy URL)")
    max_request_bytes: int = Field(default=1_048_576, gt=0, description="larger bodies get 413")
    max_json_depth: int = Field(
        default=64,
        ge=4,  # content parts sit 4 deep
        le=256,  # well inside Python's recursion limit, which json.loads and json.dumps use
        description="deepest nesting of arrays and objects in a body",
    )
    max_string_chars: int = Field(
        default=DEFAULT_LIMITS.max_string_chars,  # 524,288: about 128K tokens
        gt=0,
        description="longest string (or object key) in a body, in characters",
    )
    max_messages: int = Field(
        default=DEFAULT_LIMITS.max_messages, gt=0, description="most messages a chat request may carry (2048)"
    )
    max_stop_sequences: int = Field(
        default=DEFAULT_LIMITS.max_stop_sequences,
        ge=1,  # a single stop string counts as one
        description="most stop sequences a request may set (4)",
    )
    gateway_lenient_parameters: bool = Field(
        default=False,
        description="unknown top-level request fields are ignored instead of refused with 400 "
        "unknown_parameter (unsupported OpenAI parameters are refused either way)",
    )
    max_tokens_limit: int = Field(
        default=32768, gt=0, description="the largest max_tokens a request may ask for"
    )
    default_max_tokens: int = Field(default=256, gt=0, description="max_tokens when a request sets none")
    schedule_timeout_s: float = Field(
        default=300.0, gt=0, description="longest wait in the scheduler's queue"
    )
    require_api_key: bool | None = Field(
        default=None,
        description="None (auto): keys are required iff a key was ever created (revoked ones count)",
    )
    key_refresh_s: float = Field(
        default=5.0, gt=0, description="how often the in-memory key cache reloads (revocations)"
    )
    model_cache_s: float = Field(
        default=1.0, ge=0, description="how long a scheduler Snapshot answers /v1/models"
    )
    shutdown_grace_s: float = Field(default=10.0, ge=0, description="time in-flight requests get on SIGTERM")
    gateway_record_token_ids: bool = Field(
        default=True,
        description="CompletionRecords carry the prompt's and the output's token ids (the cache manager's "
        "workflow history); false leaves them out",
    )
    rate_limit_rpm: int = Field(
        default=0,
        ge=0,
        description="requests per minute per API key, unless the key sets its own; 0: unlimited",
    )
    rate_limit_tpm: int = Field(
        default=0,
        ge=0,
        description="tokens (prompt estimate + max_tokens) per minute per API key, unless the key sets "
        "its own; 0: unlimited",
    )
    gateway_session_headers: str = Field(
        default=",".join(SessionTagging().headers),
        description="comma-separated headers whose value, the first one present, becomes the workflow_id "
        "of a request without app_metadata; empty: untagged requests stay untagged",
    )
    gateway_session_workflow_type: str = Field(
        default=SessionTagging().workflow_type_id,
        description="workflow_type_id of a request tagged from a session header, unless it sends "
        "x-workflow-type-id",
    )
    gateway_responses_database_url: str = Field(
        default="",
        description="SQLAlchemy URL of the Responses API's stored responses; empty: CV_DATABASE_URL",
    )
    gateway_responses_ttl_s: float = Field(
        default=2_592_000.0,  # 30 days, as OpenAI keeps a stored response
        gt=0,
        description="how long a stored response (store: true) can be read back or continued",
    )
    gateway_responses_max_chain: int = Field(
        default=256,
        ge=1,
        description="most responses one previous_response_id chain may hold; a longer one is refused with 400",
    )
    gateway_responses_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="deadline of one stored-response database call; past it the request gets 503",
    )

    @classmethod
    def from_env(cls) -> GatewaySettings:
        """Defaults overridden by CV_* variables.  (``**{}`` because mypy does not see the defaults
        of core's ``ServiceSettings``, declared as positional ``Field(...)`` arguments.)"""
        return cls(**{})

    @model_validator(mode="after")
    def _check(self) -> GatewaySettings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError("default_max_tokens must not exceed max_tokens_limit")
        make_url(self.database_url)  # fail at start on a malformed URL, not at the first request
        if self.gateway_responses_database_url:
            make_url(self.gateway_responses_database_url)
        if not ID_PATTERN.match(self.gateway_session_workflow_type):
            raise ValueError(f"gateway_session_workflow_type must be {ID_RULE}")
        return self

    def session_tagging(self) -> SessionTagging:
        headers = (name.strip().lower() for name in self.gateway_session_headers.split(","))
        return SessionTagging(
            headers=tuple(name for name in headers if name),
            workflow_type_id=self.gateway_session_workflow_type,
        )

    def input_limits(self) -> InputLimits:
        return InputLimits(
            max_string_chars=self.max_string_chars,
            max_messages=self.max_messages,
            max_stop_sequences=self.max_stop_sequences,
            lenient_parameters=self.gateway_lenient_parameters,
        )

    def sqlite_path(self) -> Path | None:
        """The SQLite file behind ``database_url`` (None for other databases or in-memory SQLite)."""
        url = make_url(self.database_url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return None
        return Path(url.database)

    def responses_database_url(self) -> str:
        """Where stored responses live: their own URL, else the API keys' database."""
        return self.gateway_responses_database_url or self.database_url
