"""Profiles survive a round trip through the database, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.orm import Session

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.profiler import convert
from clairvoyant.profiler.consumer import Learner
from clairvoyant.profiler.core import CallRecord, ProfileStore, Tier, WorkflowProfile
from clairvoyant.profiler.persistence import (
    VERSION_TABLE,
    LogEntry,
    ProfileBase,
    ProfileRepository,
    ProfileRow,
    ProfileSnapshot,
    make_engine,
    scratch_schema,
    upgrade,
)
from tests.profiler.test_service_records import EPOCH, completion_records, reference_store, small_config

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str | None) -> Iterator[str]:
    """A database URL with no profiler tables: a fresh SQLite file, or a fresh schema on PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'var' / 'profiler.db'}"
        return
    if postgres_url is None:
        pytest.skip("no PostgreSQL (set CV_TEST_DATABASE_URL)")
    with scratch_schema(postgres_url) as url:
        yield url


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
        diff = compare_metadata(context, ProfileBase.metadata)
        revision = context.get_current_revision()
    repository.close()
    assert diff == []
    assert revision == "0002"


def _record(msg: common_pb2.CompletionRecord) -> CallRecord:
    keyed = convert.call_record(msg)
    assert keyed is not None
    return keyed.record


# --- the log and the snapshots ---------------------------------------------------------------------


def workload() -> list[common_pb2.CompletionRecord]:
    """Two profiles' records interleaved; every third acme instance has no workflow_end marker, so
    only an idle tick closes it."""
    acme = completion_records("acme", "coding", 24, seed=7)
    for msg in acme:
        if int(msg.app_metadata.workflow_id.split("-w")[1]) % 3 == 0:
            msg.app_metadata.workflow_end = False
    beta = completion_records("beta", "review", 8, seed=8)
    merged = []
    for i, msg in enumerate(acme):
        merged += [msg, beta[i]] if i < len(beta) else [msg]
    return merged


def feed(
    learner: Learner, repository: ProfileRepository, batches: list[list[common_pb2.CompletionRecord]],
    *, every_records: int, snapshot: bool = True,
) -> list[ProfileSnapshot]:
    """What the consumer does per batch: apply, tick at the batch's latest end time, append, then
    snapshot the profiles ``every_records`` behind.  Returns the snapshots written."""
    written = []
    for batch in batches:
        for msg in batch:
            learner.apply(msg.SerializeToString())
        learner.tick(max(m.timing.end_time for m in batch))
        repository.append(learner.pending)
        learner.logged(len(learner.pending))
        keys = learner.due(0.0, every_records, float("inf"))
        if snapshot and keys:
            snapshots = learner.snapshots(keys)
            repository.save(snapshots)
            learner.snapshotted(snapshots, 0.0)
            written += snapshots
    return written


def batched(records: list[common_pb2.CompletionRecord], size: int) -> list[list[common_pb2.CompletionRecord]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


def states(store: ProfileStore) -> dict[tuple[str, str], object]:
    return {key: profile.to_state() for key, profile in sorted(store.profiles.items())}


@pytest.mark.parametrize("crash_after", [0, 5, 11, 17])
def test_a_crash_between_log_and_snapshot_restores_the_never_restarted_state(
    database: str, crash_after: int
) -> None:
    batches = batched(workload(), 16)
    assert len(batches) > 18
    live = Learner(ProfileStore(small_config()))
    repository = ProfileRepository(database, config=small_config())
    feed(live, repository, batches[:crash_after], every_records=40)
    # The crash: batch ``crash_after`` is logged (and would be acked), its snapshot never written.
    feed(live, repository, batches[crash_after : crash_after + 1], every_records=40, snapshot=False)
    repository.close()

    reopened = ProfileRepository(database, config=small_config())
    restored = reopened.restore()
    assert sum(item.replayed for item in restored.profiles) > 0  # the log had work to do
    assert restored.next_seq == live.next_seq
    again = Learner(ProfileStore(small_config()))
    again.adopt(restored, 0.0)
    assert states(again.store) == states(live.store)
    for key, profile in live.store.profiles.items():
        assert annotations_of(again.store.profiles[key]) == annotations_of(profile)

    # Both go on with the rest: the restored one stays identical to the one that never stopped.
    feed(again, reopened, batches[crash_after + 1 :], every_records=40)
    feed(live, ProfileRepository(f"sqlite:///{Path(tempfile.mkdtemp()) / 'other.db'}"), batches[crash_after + 1 :],
         every_records=40)  # fmt: skip
    assert states(again.store) == states(live.store)
    assert states(again.store) == states(reference(workload(), batches))
    final = reopened.restore()
    reopened.close()
    assert {(p.profile.tenant, p.profile.workflow_type_id): p.profile.to_state() for p in final.profiles} == states(
        live.store
    )


def reference(records: list[common_pb2.CompletionRecord], batches: list[list[common_pb2.CompletionRecord]]) -> (
    ProfileStore
):
    """The core alone, ticking where the consumer ticked (after each batch)."""
    store = ProfileStore(small_config())
    for batch in batches:
        for msg in batch:
            keyed = convert.call_record(msg)
            assert keyed is not None
            store.ingest(*keyed)
        store.tick(max(m.timing.end_time for m in batch))
    return store


def test_pruning_keeps_exactly_the_entries_no_snapshot_covers(database: str) -> None:
    learner = Learner(ProfileStore(small_config()))
    repository = ProfileRepository(database, config=small_config())
    logged: list[tuple[int, tuple[str, str]]] = []
    ticks: list[int] = []
    original_append = repository.append

    def append(entries: Sequence[LogEntry]) -> None:
        logged.extend((e.seq, e.key) for e in entries)
        ticks.extend(e.seq for e in entries if e.record is None)
        original_append(entries)

    repository.append = append  # type: ignore[method-assign]
    snapshots = feed(learner, repository, batched(workload(), 16), every_records=50)
    covers = {}
    for snap in snapshots:
        covers[(snap.tenant, snap.workflow_type_id)] = snap.covers_seq
    assert len(snapshots) >= 4 and set(covers) == {("acme", "coding"), ("beta", "review")}
    assert len(logged) == len(workload()) + len(ticks) and len(ticks) >= 4  # every record, and the ticks
    assert repository.log_seqs() == [seq for seq, key in logged if seq > covers[key]]
    assert len(repository.log_seqs()) > 0

    # A snapshot of everything (a graceful stop) empties the log; numbering carries on after it.
    final = learner.snapshots(learner.changed())
    repository.save(final)
    learner.snapshotted(final, 0.0)
    assert repository.log_seqs() == []
    assert repository.next_seq() == learner.next_seq == logged[-1][0] + 1
    assert repository.restore().next_seq == learner.next_seq
    repository.close()


def test_appending_skips_request_ids_already_logged(database: str) -> None:
    repository = ProfileRepository(database, config=small_config())
    records = [_record(m) for m in completion_records("acme", "coding", 1, seed=9)[:4]]
    first = [LogEntry(i + 1, "acme", "coding", r) for i, r in enumerate(records)]
    repository.append([*first, LogEntry(5, "acme", "coding", None, EPOCH)])
    # A redelivered batch under new numbers: its records are skipped, its tick (no request id) is not.
    again = [LogEntry(i + 6, "acme", "coding", r) for i, r in enumerate(records[2:])]
    repository.append([*again, LogEntry(8, "acme", "coding", None, EPOCH + 1.0)])
    assert repository.log_seqs() == [1, 2, 3, 4, 5, 8]
    restored = repository.load("acme", "coding")
    repository.close()
    assert restored is not None
    assert restored.to_state()["seen"] == [r.request_id for r in records]
    assert restored.to_state()["open"][records[0].workflow_id]["calls"][0]["request_id"] == records[0].request_id


def test_a_version_0001_database_upgrades_and_keeps_its_profiles(database: str) -> None:
    profile = trained_store().profile("acme", "coding")
    engine = make_engine(database)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO profiler_profiles (tenant, workflow_type_id, state_format, state, instances, tier, "
                "updated_at) VALUES ('acme', 'coding', 1, :state, 60, 'low', :now)"
            ),
            {"state": json.dumps(profile.to_state()), "now": datetime.now(UTC)},
        )
    engine.dispose()
    repository = ProfileRepository(database)  # migrates to head
    restored = repository.restore()
    repository.close()
    assert restored.next_seq == 1
    assert [(p.profile.to_state(), p.last_seq, p.replayed) for p in restored.profiles] == [
        (profile.to_state(), 0, 0)
    ]
