"""API keys: table ``api_keys`` (SQLAlchemy 2.0; SQLite or PostgreSQL) and the store that manages it.

Only the SHA-256 of a key is stored, with its first eight characters for display; the key itself
is shown once, when it is created.  Keys look like ``cv-<urlsafe token>``.  Each key may carry its
own rate limits (``rpm``, ``tpm``; NULL: the gateway's defaults, 0: unlimited).  A table made
before those columns existed gets them added when the store opens it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import DateTime, Engine, Integer, String, create_engine, inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from clairvoyant.core.app_metadata import ID_PATTERN, ID_RULE
from clairvoyant.core.logs import mask_url

KEY_PREFIX = "cv-"
DISPLAY_CHARS = 8


class KeysBase(DeclarativeBase):
    pass


class ApiKey(KeysBase):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(DISPLAY_CHARS), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    # Rate limits per minute; NULL: the gateway's default, 0: unlimited.  Added after the table
    # first shipped: ``KeyStore`` adds them to an older table (see LIMIT_COLUMNS).
    rpm: Mapped[int | None] = mapped_column(Integer, default=None)
    tpm: Mapped[int | None] = mapped_column(Integer, default=None)


LIMIT_COLUMNS = ("rpm", "tpm")


@dataclass(frozen=True)
class KeyInfo:
    id: int
    tenant: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    rpm: int | None = None  # None: the gateway's default
    tpm: int | None = None

    @classmethod
    def of(cls, row: ApiKey) -> KeyInfo:
        return cls(
            id=row.id,
            tenant=row.tenant,
            prefix=row.prefix,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
            rpm=row.rpm,
            tpm=row.tpm,
        )


class KeyGrant(NamedTuple):
    """What an active key allows: its tenant and its own limits (None: the gateway's default)."""

    tenant: str
    rpm: int | None = None
    tpm: int | None = None


class DatabaseError(RuntimeError):
    """The key database cannot be used: a URL that does not parse, names no installed driver, or
    leads to a server that refuses.  The message is one paragraph naming the setting, with the
    URL's password masked."""


def describe_database_error(database_url: str, exc: BaseException, setting: str = "CV_DATABASE_URL") -> str:
    """One paragraph for an operator: which setting, its value (password masked), what went wrong."""
    # The driver's words, without SQLAlchemy's statement and link.
    cause = str(exc.orig) if isinstance(exc, DBAPIError) and exc.orig is not None else str(exc)
    cause = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", cause)
    cause = " ".join(cause.split()).rstrip(".")
    stop = "" if cause.endswith(("?", "!")) else "."
    return (
        f"cannot use the API key database {setting}={mask_url(database_url)}: {cause}{stop}  Set {setting} "
        "to a SQLAlchemy URL such as sqlite:///var/gateway.db or postgresql://user:password@host:5432/db"
    )


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
    url = make_url(database_url)  # raises ArgumentError when it does not parse
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    return create_engine(url, pool_pre_ping=True)


def check_limit(value: int | None, name: str) -> int | None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be 0 (unlimited) or more, not {value}")
    return value


class KeyStore:
    """CRUD on ``api_keys``.  Blocking: call it from a thread when inside the event loop."""

    def __init__(self, database_url: str, setting: str = "CV_DATABASE_URL") -> None:
        """Opens (and creates or upgrades) the table.  Raises DatabaseError, naming ``setting``
        (where the URL came from), when the database cannot be used."""
        try:
            self.engine = make_engine(database_url)
        except (
            ArgumentError,
            ImportError,
            ValueError,
            OSError,
        ) as exc:  # unparsable, no driver, no directory
            raise DatabaseError(describe_database_error(database_url, exc, setting)) from None
        try:
            KeysBase.metadata.create_all(self.engine)
            add_missing_columns(self.engine)
        except SQLAlchemyError as exc:
            self.engine.dispose()
            raise DatabaseError(describe_database_error(database_url, exc, setting)) from None

    def create(self, tenant: str, rpm: int | None = None, tpm: int | None = None) -> tuple[str, KeyInfo]:
        """A new key for ``tenant``: (the key, to show once; what is stored about it).  ``rpm`` and
        ``tpm``: its limits (None: the gateway's defaults; 0: unlimited)."""
        check_tenant(tenant)
        check_limit(rpm, "rpm")
        check_limit(tpm, "tpm")
        key = generate_key()
        row = ApiKey(
            tenant=tenant,
            key_hash=hash_key(key),
            prefix=key[:DISPLAY_CHARS],
            created_at=datetime.now(UTC),
            rpm=rpm,
            tpm=tpm,
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
        with Session(self.engine) as session, session.begin():
            row = self._one_active(session, prefix_or_key)
            row.revoked_at = datetime.now(UTC)
            return KeyInfo.of(row)

    def set_limits(self, prefix_or_key: str, changes: Mapping[str, int | None]) -> KeyInfo:
        """Change an active key's limits: ``changes`` maps "rpm" and/or "tpm" to a number (0:
        unlimited) or None (back to the gateway's default); a limit not named stays.  Raises
        LookupError as ``revoke`` does, ValueError for an unknown name or a negative limit."""
        for name, value in changes.items():
            if name not in LIMIT_COLUMNS:
                raise ValueError(f"unknown limit {name!r}; limits are {', '.join(LIMIT_COLUMNS)}")
            check_limit(value, name)
        with Session(self.engine) as session, session.begin():
            row = self._one_active(session, prefix_or_key)
            for name, value in changes.items():
                setattr(row, name, value)
            return KeyInfo.of(row)

    @staticmethod
    def _one_active(session: Session, prefix_or_key: str) -> ApiKey:
        if len(prefix_or_key) > DISPLAY_CHARS:
            condition = ApiKey.key_hash == hash_key(prefix_or_key)
        else:
            condition = ApiKey.prefix == prefix_or_key
        rows = list(session.scalars(select(ApiKey).where(condition, ApiKey.revoked_at.is_(None))))
        if not rows:
            raise LookupError(f"no active key matches {prefix_or_key!r}")
        if len(rows) > 1:
            raise LookupError(f"{len(rows)} active keys start with {prefix_or_key!r}; pass the whole key")
        return rows[0]

    def active(self) -> dict[str, str]:
        """key_hash -> tenant for every key not revoked."""
        return {key_hash: grant.tenant for key_hash, grant in self.grants().items()}

    def grants(self) -> dict[str, KeyGrant]:
        """key_hash -> (tenant, limits) for every key not revoked."""
        query = select(ApiKey.key_hash, ApiKey.tenant, ApiKey.rpm, ApiKey.tpm).where(
            ApiKey.revoked_at.is_(None)
        )
        with Session(self.engine) as session:
            return {
                key_hash: KeyGrant(tenant, rpm, tpm) for key_hash, tenant, rpm, tpm in session.execute(query)
            }

    def any_key(self) -> bool:
        """Whether a key was ever created (revoked ones count: revoking the last one must not open the
        gateway)."""
        with Session(self.engine) as session:
            return session.scalar(select(ApiKey.id).limit(1)) is not None

    def close(self) -> None:
        self.engine.dispose()


def add_missing_columns(engine: Engine) -> list[str]:
    """Add the limit columns to an ``api_keys`` table created before they existed; returns those
    added.  Safe when two processes start at once: a column the other one added is no error."""
    present = {column["name"] for column in inspect(engine).get_columns(ApiKey.__tablename__)}
    added = []
    for name in LIMIT_COLUMNS:
        if name in present:
            continue
        guard = "IF NOT EXISTS " if engine.dialect.name == "postgresql" else ""
        try:
            with engine.begin() as connection:
                connection.execute(
                    text(f"ALTER TABLE {ApiKey.__tablename__} ADD COLUMN {guard}{name} INTEGER")
                )
        except SQLAlchemyError:
            # SQLite has no IF NOT EXISTS here: a concurrent start may have added it first.
            if name not in {column["name"] for column in inspect(engine).get_columns(ApiKey.__tablename__)}:
                raise
        added.append(name)
    return added
