"""Profiles in SQL (SQLAlchemy 2; SQLite by default, PostgreSQL by URL), schema by Alembic.

One row per (tenant, workflow type) holds that profile's ``WorkflowProfile.to_state()`` as JSON
text: the learned model, the open instances and the request ids already seen, so a restart
restores every profile exactly and a redelivered record is still recognised as a duplicate.
``instances`` and ``tier`` repeat two fields of the state for listing without parsing it.

Blocking: inside the event loop, call it from a thread.  The Annotate path never touches it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from alembic import command
from alembic.config import Config
from sqlalchemy import BigInteger, DateTime, Engine, Integer, String, Text, create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from clairvoyant.profiler.core import WorkflowProfile

logger = logging.getLogger(__name__)

# Alembic's bookkeeping table, named for this service: the compose PostgreSQL database is shared.
VERSION_TABLE = "profiler_alembic_version"
# The layout of the ``state`` column (WorkflowProfile.to_state()); a new layout gets a new number.
STATE_FORMAT = 1
MIGRATIONS = Path(__file__).with_name("migrations")


class Base(DeclarativeBase):
    pass


class ProfileRow(Base):
    __tablename__ = "profiler_profiles"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    workflow_type_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    state_format: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(Text)  # JSON of WorkflowProfile.to_state()
    instances: Mapped[int] = mapped_column(BigInteger)
    tier: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ProfileSnapshot(NamedTuple):
    """A profile's state taken on the event loop, to be written from another thread."""

    tenant: str
    workflow_type_id: str
    instances: int
    tier: str
    state: dict[str, Any]  # WorkflowProfile.to_state(): plain lists, dicts, strings and numbers

    @classmethod
    def of(cls, profile: WorkflowProfile) -> ProfileSnapshot:
        """Also rebuilds ``profile``'s annotation tables: they are derived, not part of the state,
        so a restored profile builds them afresh, and this keeps the live profile serving exactly
        what it would serve after a restart."""
        profile.refresh_tables()
        return cls(
            profile.tenant,
            profile.workflow_type_id,
            profile.instances,
            profile.confidence.tier.value,
            profile.to_state(),
        )


class StoredProfile(NamedTuple):
    tenant: str
    workflow_type_id: str
    instances: int
    tier: str
    updated_at: datetime


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; creates a SQLite file's directory, and picks psycopg 3 for a
    bare ``postgresql://`` URL (psycopg2, SQLAlchemy's default driver, is not installed)."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    return create_engine(url, pool_pre_ping=True)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the migrations shipped in ``clairvoyant/profiler/migrations`` up to ``revision``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection  # env.py migrates on this connection
        command.upgrade(config, revision)


class ProfileRepository:
    """Load and save profiles; ``save`` writes a whole batch in one transaction or nothing."""

    def __init__(self, database_url: str, *, migrate: bool = True) -> None:
        self.engine = make_engine(database_url)
        if migrate:
            upgrade(self.engine)

    def save(self, snapshots: Iterable[ProfileSnapshot]) -> int:
        """Insert or replace each profile's row, all in one transaction.  Returns the rows written."""
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
                written += 1
        return written

    def load_all(self) -> list[WorkflowProfile]:
        with Session(self.engine) as session:
            rows = session.scalars(select(ProfileRow).order_by(ProfileRow.tenant, ProfileRow.workflow_type_id))
            return [_profile(row) for row in rows]

    def load(self, tenant: str, workflow_type_id: str) -> WorkflowProfile | None:
        with Session(self.engine) as session:
            row = session.get(ProfileRow, (tenant, workflow_type_id))
            return _profile(row) if row is not None else None

    def list(self, tenant: str | None = None) -> list[StoredProfile]:
        query = select(
            ProfileRow.tenant, ProfileRow.workflow_type_id, ProfileRow.instances, ProfileRow.tier,
            ProfileRow.updated_at,
        ).order_by(ProfileRow.tenant, ProfileRow.workflow_type_id)
        if tenant is not None:
            query = query.where(ProfileRow.tenant == tenant)
        with Session(self.engine) as session:
            return [StoredProfile(*row) for row in session.execute(query)]

    def close(self) -> None:
        self.engine.dispose()


def _profile(row: ProfileRow) -> WorkflowProfile:
    if row.state_format != STATE_FORMAT:
        raise ValueError(
            f"profile {row.tenant}/{row.workflow_type_id} is stored in state format {row.state_format}; "
            f"this profiler reads format {STATE_FORMAT}"
        )
    return WorkflowProfile.from_state(json.loads(row.state))
