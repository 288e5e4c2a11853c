"""The Responses API's store (``stored_responses``) on SQLite and on a real PostgreSQL: round trips,
tenants, expiry, and a database that is down or hangs."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError

from clairvoyant.core.openai_schema import ChatTurn
from clairvoyant.core.structured import ToolCall
from clairvoyant.gateway.response_store import (
    ResponseStore,
    StoredResponse,
    StoredResponseRow,
    StoreUnavailable,
    make_store_engine,
    turns_from_json,
    turns_to_json,
)

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
TURNS = (
    ChatTurn("user", "weather in Paris?"),
    ChatTurn("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    ChatTurn("tool", "sunny", name="get_weather", tool_call_id="call_1"),
    ChatTurn("assistant", "It is sunny. ü ✓"),
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def answers(url: str) -> bool:
    try:
        with make_store_engine(url, 1.0).connect() as connection:
            connection.execute(text("SELECT 1"))
    except (SQLAlchemyError, ImportError):
        return False
    return True


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'responses.db'}"
    url: str | None = request.getfixturevalue("postgres_url")
    if url is None and answers(LOCAL_POSTGRES):
        url = LOCAL_POSTGRES
    if url is None:
        pytest.skip("no PostgreSQL: set CV_TEST_DATABASE_URL")
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[ResponseStore]:
    store = ResponseStore(store_url, ttl_s=60.0, timeout_s=5.0, now=clock)
    yield store
    store.close()


def stored(response_id: str, tenant: str, depth: int = 1) -> StoredResponse:
    return StoredResponse(
        id=response_id,
        tenant=tenant,
        created_at=999.5,
        conversation_id="resp_first",
        depth=depth,
        turns=TURNS,
        response={"id": response_id, "object": "response", "output": [{"type": "message", "text": "ü"}]},
    )


def fresh_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def count_rows(url: str, tenant: str) -> int:
    engine = make_store_engine(url, 5.0)
    try:
        with engine.connect() as connection:
            query = (
                select(func.count()).select_from(StoredResponseRow).where(StoredResponseRow.tenant == tenant)
            )
            return int(connection.execute(query).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.unit
def test_turns_survive_json() -> None:
    assert turns_from_json(turns_to_json(TURNS)) == TURNS


@pytest.mark.integration
async def test_a_response_reads_back_as_it_was_saved(store: ResponseStore) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    response_id = fresh_id()
    await store.check()
    await store.save(stored(response_id, tenant, depth=3))
    loaded = await store.load(tenant, response_id)
    assert loaded == stored(response_id, tenant, depth=3)
    assert await store.load(tenant, fresh_id()) is None


@pytest.mark.integration
async def test_a_response_belongs_to_its_tenant(store: ResponseStore, store_url: str) -> None:
    owner, other = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    response_id = fresh_id()
    await store.save(stored(response_id, owner))
    assert await store.load(other, response_id) is None
    assert await store.delete(other, response_id) is False
    assert await store.load(owner, response_id) is not None
    assert await store.delete(owner, response_id) is True
    assert await store.delete(owner, response_id) is False
    assert await store.load(owner, response_id) is None
    assert count_rows(store_url, owner) == 0


@pytest.mark.integration
async def test_responses_expire_and_expired_rows_are_dropped(
    store: ResponseStore, store_url: str, clock: Clock
) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old, new = fresh_id(), fresh_id()
    await store.save(stored(old, tenant))
    clock.now += 59.0
    assert await store.load(tenant, old) is not None
    clock.now += 1.0  # 60 s after it was saved: gone
    assert await store.load(tenant, old) is None
    assert await store.delete(tenant, old) is False
    assert count_rows(store_url, tenant) == 1  # still on disk until the next write
    await store.save(stored(new, tenant))
    assert count_rows(store_url, tenant) == 1
    assert await store.load(tenant, new) is not None
    await store.delete(tenant, new)


@pytest.mark.integration
async def test_an_unreachable_database_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = ResponseStore(f"postgresql://cv:secret@127.0.0.1:{port}/test", ttl_s=60.0, timeout_s=3.0)
    try:
        for call in (store.check(), store.load("t", "resp_1"), store.save(stored("resp_1", "t"))):
            with pytest.raises(StoreUnavailable) as caught:
                await call
            assert caught.value.http_status == 503 and caught.value.code == "response_store_unavailable"
            assert "secret" not in caught.value.message and "***" in caught.value.message
    finally:
        store.close()


@pytest.mark.integration
async def test_a_hung_database_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts, never answers
        store = ResponseStore(
            f"postgresql://cv@127.0.0.1:{silent.getsockname()[1]}/test", ttl_s=60.0, timeout_s=0.3
        )
        try:
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="did not answer within 0.3 s"):
                await store.load("t", "resp_1")
            assert time.monotonic() - began < 1.5
        finally:
            store.close()


@pytest.mark.integration
async def test_the_table_is_made_on_first_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'responses.db'}"
    store = ResponseStore(url, ttl_s=60.0, timeout_s=5.0)
    try:
        assert not inspect(make_store_engine(url, 5.0)).has_table("stored_responses")
        await store.check()
        assert inspect(make_store_engine(url, 5.0)).has_table("stored_responses")
    finally:
        store.close()
