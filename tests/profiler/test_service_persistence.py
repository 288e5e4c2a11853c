"""Profiles survive a round trip through the database, on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.orm import Session

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.profiler import convert
from clairvoyant.profiler.core import CallRecord, ProfileStore, Tier, WorkflowProfile
from clairvoyant.profiler.persistence import (
    VERSION_TABLE,
    Base,
    ProfileRepository,
    ProfileRow,
    ProfileSnapshot,
)
from tests.profiler.test_service_records import completion_records, reference_store, small_config

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str | None) -> Iterator[str]:
    """A database URL with no profiler tables: a fresh SQLite file, or a fresh schema on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'var' / 'profiler.db'}"
        return
    if postgres_url is None:
        pytest.skip("no PostgreSQL (set CV_TEST_DATABASE_URL)")
    schema = f"profiler_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    separator = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def trained_store() -> ProfileStore:
    """Two workflow types of one tenant and one of another; one instance left open."""
    records = completion_records("acme", "coding", 60, seed=1) + completion_records("beta", "coding", 12, seed=2)
    records += completion_records("acme", "review", 3, seed=3)[:-2]  # the last instance stays open
    return reference_store(records, small_config())


def annotations_of(profile: WorkflowProfile) -> list[object]:
    live = next(iter(profile.to_state()["open"]), None)
    return [
        profile.annotate(agent, workflow_id=workflow_id)
        for agent in ("planner", "explorer", "engineer", "reviewer", "verifier", "nobody")
        for workflow_id in (None, live)
    ]


def test_round_trip_restores_every_profile_exactly(database: str) -> None:
    store = trained_store()
    repository = ProfileRepository(database)
    assert repository.save(ProfileSnapshot.of(p) for p in store.profiles.values()) == 3
    repository.close()

    fresh = ProfileRepository(database)  # a new process: migrations again (a no-op), then load
    loaded = {(p.tenant, p.workflow_type_id): p for p in fresh.load_all()}
    listed = fresh.list("acme")
    fresh.close()

    assert sorted(loaded) == [("acme", "coding"), ("acme", "review"), ("beta", "coding")]
    for key, original in store.profiles.items():
        restored = loaded[key]
        assert restored.to_state() == original.to_state()
        assert annotations_of(restored) == annotations_of(original)
    coding = loaded[("acme", "coding")]
    assert coding.instances == 60 and coding.confidence.tier in (Tier.LOW, Tier.HIGH)
    assert coding.annotate("planner").next_agents[0][0] == "explorer"
    assert len(loaded[("acme", "review")].to_state()["open"]) == 1
    assert [(s.workflow_type_id, s.instances, s.tier) for s in listed] == [
        ("coding", 60, coding.confidence.tier.value),
        ("review", 2, "shadow"),
    ]


def test_saving_again_replaces_the_row_and_keeps_duplicates_out(database: str) -> None:
    records = completion_records("acme", "coding", 20, seed=4)
    store = reference_store(records[:50], small_config())
    repository = ProfileRepository(database)
    repository.save([ProfileSnapshot.of(store.profile("acme", "coding"))])
    for msg in records[50:]:
        store.ingest("acme", "coding", _record(msg))
    repository.save([ProfileSnapshot.of(store.profile("acme", "coding"))])
    restored = repository.load("acme", "coding")
    assert repository.load("acme", "nothing") is None
    with Session(repository.engine) as session:
        rows = session.scalar(sa.select(sa.func.count()).select_from(ProfileRow))
    repository.close()

    assert rows == 1
    assert restored is not None and restored.instances == 20
    # Everything already seen is a duplicate for the restored profile: replays change nothing.
    before = restored.to_state()
    statuses = {restored.ingest(_record(msg)).status.value for msg in records}
    assert statuses == {"duplicate"} and restored.to_state() == before


def test_migrations_create_exactly_the_models_schema(database: str) -> None:
    repository = ProfileRepository(database)
    with repository.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        diff = compare_metadata(context, Base.metadata)
        revision = context.get_current_revision()
    repository.close()
    assert diff == []
    assert revision == "0002"


def _record(msg: common_pb2.CompletionRecord) -> CallRecord:
    keyed = convert.call_record(msg)
    assert keyed is not None
    return keyed.record
