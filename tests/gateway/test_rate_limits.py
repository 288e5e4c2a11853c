"""Per-key rate limits: the token buckets on a fake clock, the limits stored with the keys (SQLite
and PostgreSQL, an old table upgraded), the CLI, and 429s the openai SDK sees through the gateway."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from sqlalchemy import create_engine, delete, inspect, text
from typer.testing import CliRunner

from clairvoyant.gateway.auth import Authenticator
from clairvoyant.gateway.cli import app as cli
from clairvoyant.gateway.keys import ApiKey, KeyGrant, KeyStore, hash_key
from clairvoyant.gateway.ratelimit import Limits, RateLimited, RateLimiter, duration
from clairvoyant.profiler.persistence import scratch_schema
from tests.gateway.conftest import StackFactory
from tests.gateway.fakes import MODEL

CHAT = [{"role": "user", "content": "hi"}]  # estimated at 4 prompt tokens (0 chars // 4 + 4 a turn)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- the buckets ------------------------------------------------------------------------------


@pytest.mark.unit
def test_requests_per_minute_burst_then_steady_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    limits = Limits(requests_per_minute=3)
    remaining = [limiter.admit("k", limits, tokens=10)["x-ratelimit-remaining-requests"] for _ in range(3)]
    assert remaining == ["2", "1", "0"]
    with pytest.raises(RateLimited) as refused:
        limiter.admit("k", limits, tokens=10)
    assert refused.value.http_status == 429 and refused.value.code == "rate_limit_exceeded"
    assert refused.value.error_type == "requests"
    assert refused.value.retry_after_s == pytest.approx(20.0)  # one request refills every 60/3 s
    assert refused.value.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
    assert refused.value.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert "tokens" not in " ".join(refused.value.headers)  # no token limit: no token headers
    clock.now += 19.9
    with pytest.raises(RateLimited):
        limiter.admit("k", limits, tokens=10)
    clock.now += 0.1
    assert limiter.admit("k", limits, tokens=10)["x-ratelimit-remaining-requests"] == "0"
    assert limiter.admit("other", limits, tokens=10)["x-ratelimit-remaining-requests"] == "2"  # per subject


@pytest.mark.unit
def test_tokens_per_minute_charge_both_budgets_or_neither() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    limits = Limits(requests_per_minute=10, tokens_per_minute=600)
    headers = limiter.admit("k", limits, tokens=500)
    assert (headers["x-ratelimit-remaining-tokens"], headers["x-ratelimit-remaining-requests"]) == (
        "100",
        "9",
    )
    with pytest.raises(RateLimited) as refused:
        limiter.admit("k", limits, tokens=200)
    assert refused.value.error_type == "tokens"
    assert refused.value.retry_after_s == pytest.approx(10.0)  # 100 more tokens at 10 a second
    assert "limit 600, used 500, requested 200" in refused.value.message
    # The refusal charged nothing: the request budget is still at 9.
    assert limiter.admit("k", limits, tokens=100)["x-ratelimit-remaining-requests"] == "8"
    with pytest.raises(RateLimited) as never:
        limiter.admit("k", limits, tokens=601)  # more than a whole minute's budget
    assert never.value.retry_after_s == 60.0
    assert "more than the key's whole budget of 600 tokens per minute" in never.value.message


@pytest.mark.unit
def test_unlimited_and_changed_limits() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    assert limiter.admit("k", Limits(), tokens=10**9) == {}  # 0 and 0: unlimited, no headers
    for _ in range(4):
        limiter.admit("k", Limits(requests_per_minute=4), tokens=1)
    # Raising the limit keeps what was used: 4 of 8, so 4 more now.
    remaining = [limiter.admit("k", Limits(requests_per_minute=8), tokens=1) for _ in range(4)]
    assert remaining[-1]["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimited):
        limiter.admit("k", Limits(requests_per_minute=8), tokens=1)


@pytest.mark.unit
def test_idle_buckets_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(clock)
    for subject in ("a", "b"):
        limiter.admit(subject, Limits(requests_per_minute=60), tokens=1)
    clock.now += 0.5
    limiter.prune()
    assert len(limiter) == 2  # half a request refilled of one used: still remembered
    clock.now += 0.5
    limiter.prune()
    assert len(limiter) == 0


@pytest.mark.unit
def test_reset_durations_read_like_openais() -> None:
    assert [duration(s) for s in (0.0004, 0.25, 1.0, 1.44, 59.99, 60.0, 361.2)] == [
        "1ms",
        "250ms",
        "1s",
        "1.5s",
        "60s",
        "1m0s",
        "6m2s",
    ]


@pytest.mark.integration
async def test_authenticator_applies_key_limits_over_defaults(tmp_path: Path) -> None:
    store = KeyStore(f"sqlite:///{tmp_path / 'keys.db'}")
    own, _ = store.create("acme", rpm=1)
    default, _ = store.create("acme")
    clock = Clock()
    auth = Authenticator(store, require=False, now=clock)
    await auth.refresh()
    defaults = Limits(requests_per_minute=2, tokens_per_minute=0)
    assert auth.admit(f"Bearer {own}", 5, defaults)["x-ratelimit-limit-requests"] == "1"
    with pytest.raises(RateLimited):
        auth.admit(f"Bearer {own}", 5, defaults)
    assert auth.admit(f"Bearer {default}", 5, defaults)["x-ratelimit-limit-requests"] == "2"
    # Keyless callers of an open gateway share tenant default's budget.
    auth.admit(None, 5, defaults)
    auth.admit("Bearer not-a-key", 5, defaults)
    with pytest.raises(RateLimited):
        auth.admit(None, 5, defaults)
    store.close()


# ---- limits stored with the keys --------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def key_db(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str | None
) -> Iterator[tuple[str, str]]:
    """(database URL, a tenant unique to this test)."""
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'keys.db'}", tenant
        return
    if not postgres_url:
        pytest.skip("no PostgreSQL: set CV_TEST_DATABASE_URL or run a Docker engine")
    yield postgres_url, tenant
    store = KeyStore(postgres_url)
    with store.engine.begin() as conn:
        conn.execute(delete(ApiKey).where(ApiKey.tenant == tenant))
    store.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str | None) -> Iterator[str]:
    """A database with no tables (PostgreSQL: a scratch schema, dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    if not postgres_url:
        pytest.skip("no PostgreSQL: set CV_TEST_DATABASE_URL or run a Docker engine")
    with scratch_schema(postgres_url, prefix="gateway_keys") as url:
        yield url


@pytest.mark.integration
def test_a_table_from_before_limits_gets_its_columns(empty_db: str) -> None:
    engine = create_engine(empty_db.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:  # the table as the first release created it
        conn.execute(
            text(
                "CREATE TABLE api_keys (id INTEGER PRIMARY KEY, tenant VARCHAR(128) NOT NULL, "
                "key_hash VARCHAR(64) NOT NULL UNIQUE, prefix VARCHAR(8) NOT NULL, "
                "created_at TIMESTAMP WITH TIME ZONE NOT NULL, revoked_at TIMESTAMP WITH TIME ZONE)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO api_keys (id, tenant, key_hash, prefix, created_at) "
                "VALUES (1, 'acme', :h, 'cv-old00', CURRENT_TIMESTAMP)"
            ),
            {"h": hash_key("cv-old")},
        )
    engine.dispose()

    store = KeyStore(empty_db)
    try:
        columns = {c["name"] for c in inspect(store.engine).get_columns("api_keys")}
        assert {"rpm", "tpm"} <= columns
        assert store.grants() == {hash_key("cv-old"): KeyGrant("acme", None, None)}
        info = store.set_limits("cv-old00", {"rpm": 30})
        assert (info.rpm, info.tpm) == (30, None)
        KeyStore(empty_db).close()  # opening it again (the columns are there now) is no error
        assert store.grants()[hash_key("cv-old")] == KeyGrant("acme", 30, None)
    finally:
        store.close()


@pytest.mark.integration
def test_cli_sets_and_changes_limits(key_db: tuple[str, str]) -> None:
    url, tenant = key_db
    runner = CliRunner()
    created = runner.invoke(
        cli, ["keys", "create", "--tenant", tenant, "--rpm", "60", "--tpm", "9000", "--database-url", url]
    )
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    store = KeyStore(url)
    try:
        assert store.grants()[hash_key(key)] == KeyGrant(tenant, 60, 9000)
        changed = runner.invoke(cli, ["keys", "limits", key[:8], "--rpm", "0", "--database-url", url])
        assert changed.exit_code == 0, changed.output
        assert "rpm unlimited, tpm 9000" in changed.stdout
        assert store.grants()[hash_key(key)] == KeyGrant(tenant, 0, 9000)
        reset = runner.invoke(cli, ["keys", "limits", key[:8], "--tpm", "default", "--database-url", url])
        assert reset.exit_code == 0 and store.grants()[hash_key(key)] == KeyGrant(tenant, 0, None)
        listed = runner.invoke(cli, ["keys", "list", "--database-url", url])
        assert f"{key[:8]}  {tenant}" in listed.stdout and "rpm unlimited, tpm default" in listed.stdout

        bad = runner.invoke(cli, ["keys", "limits", key[:8], "--rpm", "-3", "--database-url", url])
        assert bad.exit_code == 2 and "neither a number" in bad.output
        negative = runner.invoke(
            cli, ["keys", "create", "--tenant", tenant, "--rpm", "-1", "--database-url", url]
        )
        assert negative.exit_code == 2
        nothing = runner.invoke(cli, ["keys", "limits", key[:8], "--database-url", url])
        assert nothing.exit_code == 2 and "give --rpm, --tpm or both" in nothing.output
        unknown = runner.invoke(cli, ["keys", "limits", "cv-nope0", "--rpm", "1", "--database-url", url])
        assert unknown.exit_code == 1 and "no active key" in unknown.output
    finally:
        store.close()


# ---- through the gateway ----------------------------------------------------------------------


@pytest.mark.integration
async def test_a_key_over_its_request_limit_gets_openai_429s(
    make_stack: StackFactory, key_db: tuple[str, str]
) -> None:
    url, tenant = key_db
    store = KeyStore(url)
    key, _ = store.create(tenant, rpm=2)
    other, _ = store.create(tenant)  # the gateway's default applies: unlimited here
    store.close()
    stack = await make_stack(database_url=url, rate_limit_rpm=0)
    stack.server.frontend.auth.limiter = RateLimiter(Clock())  # time stands still: exact budgets
    client = stack.openai(api_key=key)
    for expected_remaining in ("1", "0"):
        raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT)
        assert raw.headers["x-ratelimit-limit-requests"] == "2"
        assert raw.headers["x-ratelimit-remaining-requests"] == expected_remaining
        assert raw.parse().choices[0].message.content == "Hello, world!"
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model=MODEL, messages=CHAT)
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded" and error.type == "requests"
    assert error.body == {
        "message": "rate limit reached on requests per minute: limit 2, used 2, requested 1; retry in 30s",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert int(error.response.headers["retry-after"]) == 30  # one request refills every 30 s
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(stack.scheduler.schedule_calls) == 2  # the refusal never reached the scheduler

    assert (await stack.openai(api_key=other).chat.completions.create(model=MODEL, messages=CHAT)).choices
    assert len(stack.scheduler.schedule_calls) == 3


@pytest.mark.integration
async def test_default_token_limit_counts_prompt_estimate_and_max_tokens(make_stack: StackFactory) -> None:
    stack = await make_stack(rate_limit_tpm=100)  # an open gateway: everyone is tenant default
    stack.server.frontend.auth.limiter = RateLimiter(Clock())
    client = stack.openai()
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=60)
    assert raw.headers["x-ratelimit-limit-tokens"] == "100"
    assert raw.headers["x-ratelimit-remaining-tokens"] == "36"  # 100 - (4 estimated + 60)
    assert "x-ratelimit-limit-requests" not in raw.headers
    with pytest.raises(openai.RateLimitError) as refused:
        await client.completions.create(model=MODEL, prompt="x" * 40, max_tokens=30)  # 10 + 30 > 36
    assert refused.value.type == "tokens" and refused.value.code == "rate_limit_exceeded"
    assert int(refused.value.response.headers["retry-after"]) == 3  # 4 tokens short at 100/60 a second
    with pytest.raises(openai.RateLimitError) as never:
        await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=500)
    assert "whole budget of 100 tokens per minute" in never.value.message
    assert len(stack.scheduler.schedule_calls) == 1


@pytest.mark.integration
async def test_changed_limits_apply_after_the_key_cache_reloads(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    store = KeyStore(url)
    key, info = store.create("acme", rpm=1)
    stack = await make_stack(database_url=url)
    stack.server.frontend.auth.limiter = RateLimiter(Clock())
    client = stack.openai(api_key=key)
    await client.chat.completions.create(model=MODEL, messages=CHAT)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model=MODEL, messages=CHAT)
    store.set_limits(info.prefix, {"rpm": 0})
    store.close()
    await stack.server.frontend.auth.refresh()  # what the periodic reload does within key_refresh_s
    for _ in range(3):
        await client.chat.completions.create(model=MODEL, messages=CHAT)
    assert len(stack.scheduler.schedule_calls) == 4
