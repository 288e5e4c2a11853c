"""ProfileStore: the workflow profiles of every (tenant, workflow type), created on first ingest.

Profiles never share anything across tenants: every profile is keyed by (tenant, workflow type).
``annotate`` for a pair never ingested is ``Annotation.empty()`` (confidence NONE); nothing here
raises on an unknown tenant or type.
"""

from __future__ import annotations

from typing import Any

from clairvoyant.profiler.core.profile import WorkflowProfile
from clairvoyant.profiler.core.profile_types import Annotation, CallRecord, IngestResult, ProfileConfig
from clairvoyant.profiler.core.trace import WorkflowTrace


class ProfileStore:
    """The profiles of all (tenant, workflow type) pairs; unknown pairs annotate as confidence NONE."""

    def __init__(self, config: ProfileConfig | None = None) -> None:
        self.config = config or ProfileConfig()
        self.profiles: dict[tuple[str, str], WorkflowProfile] = {}

    def profile(self, tenant: str, workflow_type_id: str) -> WorkflowProfile:
        key = (tenant, workflow_type_id)
        if key not in self.profiles:
            self.profiles[key] = WorkflowProfile(tenant, workflow_type_id, self.config)
        return self.profiles[key]

    def ingest(self, tenant: str, workflow_type_id: str, record: CallRecord) -> IngestResult:
        return self.profile(tenant, workflow_type_id).ingest(record)

    def tick(self, now: float) -> tuple[WorkflowTrace, ...]:
        return tuple(t for p in self.profiles.values() for t in p.tick(now))

    def annotate(self, tenant: str, workflow_type_id: str, agent_id: str, **kwargs: Any) -> Annotation:
        profile = self.profiles.get((tenant, workflow_type_id))
        return profile.annotate(agent_id, **kwargs) if profile is not None else Annotation.empty()
