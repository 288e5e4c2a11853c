"""API keys: table ``api_keys`` (SQLAlchemy 2.0; SQLite or PostgreSQL) and the store that manages it.

Only the SHA-256 of a key is stored, with its first eight characters for display; the key itself
is shown once, when it is created.  Keys look like ``cv-<urlsafe token>``.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import DateTime, Engine, String, create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from clairvoyant.core.app_metadata import ID_PATTERN, ID_RULE

KEY_PREFIX = "cv-"
DISPLAY_CHARS = 8


class Base(DeclarativeBase):
    pass


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(DISPLAY_CHARS), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)


@dataclass(frozen=True)
class KeyInfo:
    id: int
    tenant: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: ApiKey) -> KeyInfo:
        return cls(row.id, row.tenant, row.prefix, row.created_at, row.revoked_at)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def check_tenant(tenant: str) -> str:
    if not ID_PATTERN.match(tenant):
        raise ValueError(f"invalid tenant {tenant!r}: use {ID_RULE}")
    return tenant


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url``; creates a SQLite file's directory, and picks psycopg 3 for
    a bare ``postgresql://`` URL (psycopg2, SQLAlchemy's default, is not installed)."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    return create_engine(url, pool_pre_ping=True)


class KeyStore:
    """CRUD on ``api_keys``.  Blocking: call it from a thread when inside the event loop."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)
        Base.metadata.create_all(self.engine)

    def create(self, tenant: str) -> tuple[str, KeyInfo]:
        """A new key for ``tenant``: (the key, to show once; what is stored about it)."""
        check_tenant(tenant)
        key = generate_key()
        row = ApiKey(
            tenant=tenant, key_hash=hash_key(key), prefix=key[:DISPLAY_CHARS], created_at=datetime.now(UTC)
        )
        with Session(self.engine) as session, session.begin():
            session.add(row)
            session.flush()
            info = KeyInfo.of(row)
        return key, info

    def list(self, include_revoked: bool = True) -> list[KeyInfo]:
        query = select(ApiKey).order_by(ApiKey.id)
        if not include_revoked:
            query = query.where(ApiKey.revoked_at.is_(None))
        with Session(self.engine) as session:
            return [KeyInfo.of(row) for row in session.scalars(query)]

    def revoke(self, prefix_or_key: str) -> KeyInfo:
        """Revoke the one active key with this display prefix (or this exact key).

        Raises LookupError when none matches, or more than one does (give the whole key then).
        """
        if len(prefix_or_key) > DISPLAY_CHARS:
            condition = ApiKey.key_hash == hash_key(prefix_or_key)
        else:
            condition = ApiKey.prefix == prefix_or_key
        with Session(self.engine) as session, session.begin():
            rows = list(session.scalars(select(ApiKey).where(condition, ApiKey.revoked_at.is_(None))))
            if not rows:
                raise LookupError(f"no active key matches {prefix_or_key!r}")
            if len(rows) > 1:
                raise LookupError(f"{len(rows)} active keys start with {prefix_or_key!r}; pass the whole key")
            rows[0].revoked_at = datetime.now(UTC)
            return KeyInfo.of(rows[0])

    def active(self) -> dict[str, str]:
        """key_hash -> tenant for every key not revoked."""
        query = select(ApiKey.key_hash, ApiKey.tenant).where(ApiKey.revoked_at.is_(None))
        with Session(self.engine) as session:
            return {key_hash: tenant for key_hash, tenant in session.execute(query)}

    def any_key(self) -> bool:
        """Whether a key was ever created (revoked ones count: revoking the last one must not open the
        gateway)."""
        with Session(self.engine) as session:
            return session.scalar(select(ApiKey.id).limit(1)) is not None

    def close(self) -> None:
        self.engine.dispose()
