"""Stored responses of the Responses API: table ``stored_responses`` (SQLAlchemy 2.0; SQLite or
PostgreSQL), per tenant, kept ``ttl_s`` seconds.

Contract of ``ResponseStore``: every method is a coroutine that either finishes within
``timeout_s`` or raises ``StoreUnavailable`` (503): a database that is down, refuses, or hangs
never holds a request.  The table is created on first use, so a gateway whose database is down at
start still serves everything that stores nothing.  A row of another tenant, or one past its
expiry, reads as absent.  Each row holds the whole conversation after its response (instructions
left out, as OpenAI does not carry them over), so continuing a chain is one read.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Engine, Float, Integer, String, Text, create_engine, delete, select
from sqlalchemy.engine import CursorResult, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from clairvoyant.core.errors import Unavailable
from clairvoyant.core.logs import mask_url
from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import ToolCall

T = TypeVar("T")
STORE_THREADS = 4  # calls to a hung database wait here, not in the event loop's default executor


class StoreUnavailable(Unavailable):
    default_code = "response_store_unavailable"


class ResponsesBase(DeclarativeBase):
    pass


class StoredResponseRow(ResponsesBase):
    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # resp_<request id>
    tenant: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[float] = mapped_column(Float)  # seconds since the epoch
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    conversation_id: Mapped[str] = mapped_column(String(64))  # the chain's first response
    depth: Mapped[int] = mapped_column(Integer)  # responses in the chain, this one included
    turns: Mapped[str] = mapped_column(Text)  # JSON: the conversation after this response
    response: Mapped[str] = mapped_column(Text)  # JSON: the response object, as returned


@dataclass(frozen=True)
class StoredResponse:
    id: str
    tenant: str
    created_at: float
    conversation_id: str  # the id of the chain's first response (its own id for a first one)
    depth: int  # 1 for a response without previous_response_id
    turns: tuple[ChatTurn, ...]  # the conversation after this response, without instructions
    response: dict[str, Any]  # the response object as GET /v1/responses/{id} returns it


def turns_to_json(turns: Sequence[ChatTurn]) -> str:
    return json.dumps(
        [
            {
                "role": turn.role,
                "content": turn.content,
                "name": turn.name,
                "tool_calls": [[call.id, call.name, call.arguments] for call in turn.tool_calls],
                "tool_call_id": turn.tool_call_id,
            }
            for turn in turns
        ],
        separators=(",", ":"),
    )


def turns_from_json(text: str) -> tuple[ChatTurn, ...]:
    return tuple(
        ChatTurn(
            role=entry["role"],
            content=entry["content"],
            name=entry["name"],
            tool_calls=tuple(ToolCall(*call) for call in entry["tool_calls"]),
            tool_call_id=entry["tool_call_id"],
        )
        for entry in json.loads(text)
    )


def make_store_engine(database_url: str, timeout_s: float) -> Engine:
    """An engine whose connections give up after ``timeout_s`` (psycopg 3 for a bare
    ``postgresql://`` URL, as the key store picks it)."""
    url = make_url(database_url)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    backend = url.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend == "postgresql":
        connect_args = {
            "connect_timeout": max(1, math.ceil(timeout_s)),
            "options": f"-c statement_timeout={max(1, int(timeout_s * 1000))}",
        }
    elif backend == "sqlite":
        connect_args = {"timeout": timeout_s}  # a locked database file
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


class ResponseStore:
    """Reads and writes ``stored_responses``; see the module docstring for the contract."""

    def __init__(
        self, database_url: str, *, ttl_s: float, timeout_s: float, now: Callable[[], float] = time.time
    ) -> None:
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._now = now
        self._where = mask_url(database_url)
        self._engine = make_store_engine(database_url, timeout_s)
        self._executor = ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="response-store")
        self._table_lock = threading.Lock()
        self._table_ready = False

    async def check(self) -> None:
        """Raise StoreUnavailable unless the database answers (and holds the table)."""
        await self._run(self._ping)

    async def save(self, stored: StoredResponse) -> None:
        """Insert ``stored``, expiring ``ttl_s`` from now; drops rows already expired."""
        await self._run(lambda: self._save(stored))

    async def load(self, tenant: str, response_id: str) -> StoredResponse | None:
        """``tenant``'s unexpired response ``response_id``, or None."""
        return await self._run(lambda: self._load(tenant, response_id))

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Delete ``tenant``'s response ``response_id``; False when there was none."""
        return await self._run(lambda: self._delete(tenant, response_id))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._engine.dispose()

    async def _run(self, work: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._executor, work), self.timeout_s)
        except TimeoutError:
            raise StoreUnavailable(
                f"the response store ({self._where}) did not answer within {self.timeout_s:g} s"
            ) from None
        except SQLAlchemyError as exc:
            cause = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
            raise StoreUnavailable(f"the response store ({self._where}) failed: {cause}") from None

    def _ensure_table(self) -> None:
        with self._table_lock:
            if not self._table_ready:
                ResponsesBase.metadata.create_all(self._engine)
                self._table_ready = True

    def _ping(self) -> None:
        self._ensure_table()
        with self._engine.connect() as connection:  # the table was there once: prove the server answers
            connection.execute(select(StoredResponseRow.id).limit(1))

    def _save(self, stored: StoredResponse) -> None:
        self._ensure_table()
        now = self._now()
        row = StoredResponseRow(
            id=stored.id,
            tenant=stored.tenant,
            created_at=stored.created_at,
            expires_at=now + self.ttl_s,
            conversation_id=stored.conversation_id,
            depth=stored.depth,
            turns=turns_to_json(stored.turns),
            response=json.dumps(stored.response, separators=(",", ":")),
        )
        with Session(self._engine) as session, session.begin():
            session.execute(delete(StoredResponseRow).where(StoredResponseRow.expires_at <= now))
            session.add(row)

    def _load(self, tenant: str, response_id: str) -> StoredResponse | None:
        self._ensure_table()
        query = select(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.tenant == tenant,
            StoredResponseRow.expires_at > self._now(),
        )
        with Session(self._engine) as session:
            row = session.scalar(query)
            if row is None:
                return None
            return StoredResponse(
                id=row.id,
                tenant=row.tenant,
                created_at=row.created_at,
                conversation_id=row.conversation_id,
                depth=row.depth,
                turns=turns_from_json(row.turns),
                response=json.loads(row.response),
            )

    def _delete(self, tenant: str, response_id: str) -> bool:
        self._ensure_table()
        query = delete(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.tenant == tenant,
            StoredResponseRow.expires_at > self._now(),
        )
        with Session(self._engine) as session, session.begin():
            result = cast(CursorResult[Any], session.execute(query))
            return result.rowcount > 0
