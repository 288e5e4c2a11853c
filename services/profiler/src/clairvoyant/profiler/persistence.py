"""Profiles in SQL (SQLAlchemy 2; SQLite by default, PostgreSQL by URL), schema by Alembic.

A write-ahead log of changes plus periodic snapshots:

    profiler_log       one row per change to a profile, in the order it was applied (``seq``,
                       increasing): a record ingested (its ``request_id``, UNIQUE, and the
                       CallRecord as a compact JSON list) or an idle tick (request_id NULL, the
                       tick's time), so re-applying the rows in order repeats the original run
    profiler_profiles  per (tenant, workflow type): the latest ``WorkflowProfile.to_state()``
                       and ``covers_seq``, the last log row of that profile the state includes

A profile is its snapshot plus its log rows after ``covers_seq``, re-applied in order (``restore``).
Writing a snapshot deletes the rows it covers, in the same transaction:

    seq        1   2   3   4   5   6   7   8
    profile A  a1      a2      a3  a4
    profile B      b1      b2          b3  b4
    snapshot of A with covers_seq 5: a1..a3 deleted; restoring A = from_state + a4

``seq`` is allocated by the single writer (the consumer's Learner), after ``next_seq()``.  A batch
appended twice keeps one row per request id: the insert skips ids already logged.
``instances`` and ``tier`` repeat two fields of the snapshot for listing without parsing it.

Blocking: inside the event loop, call it from a thread.  The Annotate path never touches it.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    Index,
    Insert,
    Integer,
    String,
    Text,
    create_engine,
    delete,
    event,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from clairvoyant.core.logs import mask_url
from clairvoyant.profiler.core import CallRecord, ProfileConfig, WorkflowProfile

logger = logging.getLogger(__name__)

# Alembic's bookkeeping table, named for this service: the compose PostgreSQL database is shared.
VERSION_TABLE = "profiler_alembic_version"
# The layout of the ``state`` column (WorkflowProfile.to_state()); a new layout gets a new number.
STATE_FORMAT = 1
MIGRATIONS = Path(__file__).with_name("migrations")

Key = tuple[str, str]  # (tenant, workflow_type_id)


class ProfileBase(DeclarativeBase):
    pass


class ProfileRow(ProfileBase):
    __tablename__ = "profiler_profiles"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    workflow_type_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    state_format: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(Text)  # JSON of WorkflowProfile.to_state()
    instances: Mapped[int] = mapped_column(BigInteger)
    tier: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    covers_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")  # the last log row in ``state``


class LogRow(ProfileBase):
    __tablename__ = "profiler_log"
    __table_args__ = (Index("ix_profiler_log_profile_seq", "tenant", "workflow_type_id", "seq"),)

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    tenant: Mapped[str] = mapped_column(String(128))
    workflow_type_id: Mapped[str] = mapped_column(String(128))
    request_id: Mapped[str | None] = mapped_column(String(255), unique=True)  # NULL: an idle tick
    body: Mapped[str] = mapped_column(Text)  # a record: _RECORD_FIELDS as a JSON list; a tick: [now]


class LogEntry(NamedTuple):
    """One change to one profile: a record it ingested, or an idle tick that closed instances."""

    seq: int
    tenant: str
    workflow_type_id: str
    record: CallRecord | None  # None: a tick at ``tick_at``
    tick_at: float = 0.0

    @property
    def key(self) -> Key:
        return (self.tenant, self.workflow_type_id)

    def apply(self, profile: WorkflowProfile) -> None:
        """Repeat the change on ``profile``: the core is deterministic, so the result is the same."""
        if self.record is not None:
            profile.ingest(self.record)
        else:
            profile.tick(self.tick_at)


class ProfileSnapshot(NamedTuple):
    """A profile's state taken on the event loop, to be written from another thread."""

    tenant: str
    workflow_type_id: str
    instances: int
    tier: str
    state: dict[str, Any]  # WorkflowProfile.to_state(): plain lists, dicts, strings and numbers
    covers_seq: int = 0  # the last log entry of this profile that ``state`` includes

    @classmethod
    def of(cls, profile: WorkflowProfile, covers_seq: int = 0) -> ProfileSnapshot:
        """Also rebuilds ``profile``'s annotation tables: they are derived, not part of the state,
        so a restored profile builds them afresh (``restore``), and this keeps the live profile
        serving exactly what a restored one would."""
        profile.refresh_tables()
        return cls(
            profile.tenant,
            profile.workflow_type_id,
            profile.instances,
            profile.confidence.tier.value,
            profile.to_state(),
            covers_seq,
        )


class StoredProfile(NamedTuple):
    """A profile as of its latest snapshot."""

    tenant: str
    workflow_type_id: str
    instances: int
    tier: str
    updated_at: datetime


class RestoredProfile(NamedTuple):
    profile: WorkflowProfile
    last_seq: int  # the last log entry the profile now includes (0: none)
    replayed: int  # log entries re-applied on top of its snapshot: changes no snapshot holds yet


class Restored(NamedTuple):
    profiles: list[RestoredProfile]  # by (tenant, workflow type)
    next_seq: int  # the first sequence number not used yet


class DatabaseUnavailable(RuntimeError):
    """The profile database cannot be used: its URL does not parse, names a driver that is not
    installed, or leads to a server that refuses.  The message is one paragraph naming the setting
    (``CV_DATABASE_URL`` unless the caller says otherwise), with the URL's password masked."""


def describe_database_error(database_url: str, exc: BaseException, setting: str = "CV_DATABASE_URL") -> str:
    """One paragraph for an operator: which setting, its value (password masked), what went wrong."""
    cause = str(exc.orig) if isinstance(exc, DBAPIError) and exc.orig is not None else str(exc)
    cause = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", cause)  # SQLAlchemy's link
    cause = " ".join(cause.split()).rstrip(".")
    stop = "" if cause.endswith(("?", "!")) else "."
    return (
        f"cannot use the profile database {setting}={mask_url(database_url)}: {cause}{stop}  Set {setting} "
        "to a SQLAlchemy URL such as sqlite:///var/profiler.db or postgresql://user:password@host:5432/db"
    )


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; creates a SQLite file's directory and puts it in WAL mode
    (a commit appends to the WAL, and ``show`` can read while the service writes), and picks
    psycopg 3 for a bare ``postgresql://`` URL (psycopg2, SQLAlchemy's default, is not installed)."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    engine = create_engine(url, pool_pre_ping=True)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # synchronous stays FULL: a commit is on disk
            cursor.close()

    return engine


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations shipped in ``clairvoyant/profiler/migrations`` up to ``revision``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    # Alembic logs every plugin it sets up at INFO; the revisions it runs are what an operator needs.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    with engine.begin() as connection:
        config.attributes["connection"] = connection  # env.py migrates on this connection
        command.upgrade(config, revision)



@contextmanager
def scratch_schema(postgres_url: str, prefix: str = "profiler") -> Iterator[str]:
    """A PostgreSQL URL whose search path is a fresh, empty schema, dropped on exit (tests and
    benchmarks: a private set of profiler tables in a shared database)."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(postgres_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    separator = "&" if "?" in postgres_url else "?"
    try:
        yield f"{postgres_url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()

class ProfileRepository:
    """The log and the snapshots.  ``append`` and ``save`` each write in one transaction or not at all.

    ``config``: the model settings of a profile that has log entries but no snapshot yet (the
    service passes its own; a profile with a snapshot keeps the config stored in it)."""

    def __init__(
        self,
        database_url: str,
        *,
        migrate: bool = True,
        config: ProfileConfig | None = None,
        setting: str = "CV_DATABASE_URL",
    ) -> None:
        """Raises DatabaseUnavailable, naming ``setting`` (where the URL came from), when
        ``database_url`` cannot be used.  The caller reports it: serve and show print it and exit."""
        try:
            self.engine = make_engine(database_url)
        except (ArgumentError, ImportError, ValueError, OSError) as exc:  # unparsable, no driver, no directory
            raise DatabaseUnavailable(describe_database_error(database_url, exc, setting)) from None
        self.config = config or ProfileConfig()
        if migrate:
            try:
                upgrade(self.engine)
            except SQLAlchemyError as exc:
                self.engine.dispose()
                raise DatabaseUnavailable(describe_database_error(database_url, exc, setting)) from None
        insert = postgresql.insert if self.engine.dialect.name == "postgresql" else sqlite.insert
        # Insert-or-ignore on the request id: a record logged before (a redelivery) is skipped.
        self._append: Insert = insert(LogRow).on_conflict_do_nothing(index_elements=["request_id"])

    # ------------------------------------------------------------------------------- writing

    def append(self, entries: Sequence[LogEntry]) -> None:
        """Log ``entries`` in one transaction; a record whose request id is logged already is skipped."""
        if not entries:
            return
        rows = [
            {
                "seq": e.seq,
                "tenant": e.tenant,
                "workflow_type_id": e.workflow_type_id,
                "request_id": None if e.record is None else e.record.request_id,
                "body": _encode(e),
            }
            for e in entries
        ]
        with self.engine.begin() as connection:
            connection.execute(self._append, rows)

    def save(self, snapshots: Iterable[ProfileSnapshot]) -> int:
        """Insert or replace each profile's snapshot and delete the log rows it covers, all in one
        transaction.  Returns the snapshots written."""
        now = datetime.now(UTC)
        written = 0
        with Session(self.engine) as session, session.begin():
            for snap in snapshots:
                text = json.dumps(snap.state, separators=(",", ":"))  # Infinity stays representable
                row = session.get(ProfileRow, (snap.tenant, snap.workflow_type_id))
                if row is None:
                    row = ProfileRow(tenant=snap.tenant, workflow_type_id=snap.workflow_type_id)
                    session.add(row)
                row.state_format = STATE_FORMAT
                row.state = text
                row.instances = snap.instances
                row.tier = snap.tier
                row.updated_at = now
                row.covers_seq = snap.covers_seq
                session.execute(
                    delete(LogRow).where(
                        LogRow.tenant == snap.tenant,
                        LogRow.workflow_type_id == snap.workflow_type_id,
                        LogRow.seq <= snap.covers_seq,
                    )
                )
                written += 1
        return written

    # ------------------------------------------------------------------------------- reading

    def restore(self) -> Restored:
        """Every profile as the writer last left it: its snapshot, then its later log entries."""
        with Session(self.engine) as session:
            snapshots = {(r.tenant, r.workflow_type_id): r for r in session.scalars(select(ProfileRow))}
            entries = [_decode(row) for row in session.execute(_LOG_COLUMNS.order_by(LogRow.seq))]
            last_seq = max(
                [r.covers_seq for r in snapshots.values()] + [e.seq for e in entries[-1:]], default=0
            )
        return Restored(self._replay(snapshots, entries), last_seq + 1)

    def next_seq(self) -> int:
        with Session(self.engine) as session:
            logged = session.scalar(select(func.max(LogRow.seq))) or 0
            covered = session.scalar(select(func.max(ProfileRow.covers_seq))) or 0
        return max(logged, covered) + 1

    def load_all(self) -> list[WorkflowProfile]:
        return [r.profile for r in self.restore().profiles]

    def load(self, tenant: str, workflow_type_id: str) -> WorkflowProfile | None:
        with Session(self.engine) as session:
            row = session.get(ProfileRow, (tenant, workflow_type_id))
            logged = session.execute(
                _LOG_COLUMNS.where(LogRow.tenant == tenant, LogRow.workflow_type_id == workflow_type_id)
                .order_by(LogRow.seq)
            )
            entries = [_decode(r) for r in logged]
            snapshots = {} if row is None else {(tenant, workflow_type_id): row}
        restored = self._replay(snapshots, entries)
        return restored[0].profile if restored else None

    def log_seqs(self) -> list[int]:
        """The sequence numbers still in the log (what pruning kept), ascending."""
        with Session(self.engine) as session:
            return list(session.scalars(select(LogRow.seq).order_by(LogRow.seq)))

    def close(self) -> None:
        self.engine.dispose()

    def _replay(self, snapshots: dict[Key, ProfileRow], entries: Iterable[LogEntry]) -> list[RestoredProfile]:
        profiles: dict[Key, WorkflowProfile] = {}
        last_seq: dict[Key, int] = {}
        replayed: dict[Key, int] = {}
        for key, row in snapshots.items():
            profile = _profile(row)
            # What the live profile did when it took this snapshot (ProfileSnapshot.of): the
            # annotation tables, and the core's count towards their next rebuild, start afresh.
            profile.refresh_tables()
            profiles[key] = profile
            last_seq[key] = row.covers_seq
        for entry in entries:
            key = entry.key
            if entry.seq <= last_seq.get(key, 0):
                continue  # in the snapshot already
            if key not in profiles:
                profiles[key] = WorkflowProfile(entry.tenant, entry.workflow_type_id, self.config)
            entry.apply(profiles[key])
            last_seq[key] = entry.seq
            replayed[key] = replayed.get(key, 0) + 1
        return [RestoredProfile(profiles[k], last_seq[k], replayed.get(k, 0)) for k in sorted(profiles)]

    def list(self, tenant: str | None = None) -> list[StoredProfile]:
        """The profiles that have a snapshot, as of it."""
        query = select(
            ProfileRow.tenant, ProfileRow.workflow_type_id, ProfileRow.instances, ProfileRow.tier,
            ProfileRow.updated_at,
        ).order_by(ProfileRow.tenant, ProfileRow.workflow_type_id)
        if tenant is not None:
            query = query.where(ProfileRow.tenant == tenant)
        with Session(self.engine) as session:
            return [StoredProfile(*row) for row in session.execute(query)]


def _profile(row: ProfileRow) -> WorkflowProfile:
    if row.state_format != STATE_FORMAT:
        raise ValueError(
            f"profile {row.tenant}/{row.workflow_type_id} is stored in state format {row.state_format}; "
            f"this profiler reads format {STATE_FORMAT}"
        )
    return WorkflowProfile.from_state(json.loads(row.state))


# A record's body: these CallRecord fields in this order (request_id has its own column).  A new
# field goes at the end; decoding fills fields missing from older rows with their defaults.
_RECORD_FIELDS = (
    "workflow_id", "agent_id", "start", "end", "prompt_tokens", "output_tokens", "upstream_agent_id",
    "parent_request_ids", "tool", "workflow_version", "workflow_end", "prompt_blocks", "response_blocks",
    "model",
)  # fmt: skip
_TUPLE_FIELDS = frozenset({"parent_request_ids", "prompt_blocks", "response_blocks"})
_LOG_COLUMNS = select(LogRow.seq, LogRow.tenant, LogRow.workflow_type_id, LogRow.request_id, LogRow.body)


def _encode(entry: LogEntry) -> str:
    if entry.record is None:
        return json.dumps([entry.tick_at])
    record = entry.record
    return json.dumps([getattr(record, name) for name in _RECORD_FIELDS], separators=(",", ":"))


def _decode(row: Any) -> LogEntry:
    values = json.loads(row.body)
    if row.request_id is None:
        return LogEntry(row.seq, row.tenant, row.workflow_type_id, None, float(values[0]))
    fields: dict[str, Any] = {
        name: tuple(value) if name in _TUPLE_FIELDS else value
        for name, value in zip(_RECORD_FIELDS, values, strict=False)
    }
    return LogEntry(row.seq, row.tenant, row.workflow_type_id, CallRecord(request_id=row.request_id, **fields))
