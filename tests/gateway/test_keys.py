"""API keys: the CLI against SQLite and PostgreSQL, hashed storage, revocation, HTTP authentication."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import delete, text
from typer.testing import CliRunner

from clairvoyant.gateway.auth import Authenticator, bearer_token
from clairvoyant.gateway.cli import app as cli
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.keys import ApiKey, KeyStore
from tests.gateway.conftest import StackFactory
from tests.gateway.fakes import MODEL


@pytest.fixture(params=["sqlite", "postgresql"])
def key_db(request: pytest.FixtureRequest, tmp_path: Path, postgres_url: str | None) -> Iterator[tuple[str, str]]:
    """(database URL, a tenant name unique to this test); PostgreSQL from the shared fixture."""
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'keys.db'}", tenant  # the directory is created on demand
        return
    if not postgres_url:
        pytest.skip("no PostgreSQL: set CV_TEST_DATABASE_URL or run a Docker engine")
    yield postgres_url, tenant
    store = KeyStore(postgres_url)  # the database outlives the test: remove what it added
    with store.engine.begin() as conn:
        conn.execute(delete(ApiKey).where(ApiKey.tenant == tenant))
    store.close()


@pytest.mark.integration
def test_cli_create_list_revoke(key_db: tuple[str, str]) -> None:
    url, tenant = key_db
    runner = CliRunner()
    created = runner.invoke(cli, ["keys", "create", "--tenant", tenant, "--database-url", url])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("cv-") and len(key) > 40

    store = KeyStore(url)
    try:
        with store.engine.connect() as conn:
            rows = [
                tuple(row)
                for row in conn.execute(text("SELECT * FROM api_keys WHERE tenant = :t"), {"t": tenant})
            ]
        assert len(rows) == 1
        assert not any(key in str(value) for value in rows[0]), "the raw key must not be stored"
        [info] = [i for i in store.list() if i.tenant == tenant]
        assert info.prefix == key[:8] and info.revoked_at is None
        assert store.active()[hashlib.sha256(key.encode()).hexdigest()] == tenant

        listed = runner.invoke(cli, ["keys", "list", "--database-url", url])
        assert listed.exit_code == 0 and key[:8] in listed.stdout and key not in listed.stdout

        revoked = runner.invoke(cli, ["keys", "revoke", key[:8], "--database-url", url])
        assert revoked.exit_code == 0, revoked.output
        assert hashlib.sha256(key.encode()).hexdigest() not in store.active()
        assert [i.revoked_at is not None for i in store.list() if i.tenant == tenant] == [True]
        again = runner.invoke(cli, ["keys", "revoke", key[:8], "--database-url", url])
        assert again.exit_code == 1 and "no active key" in again.output
    finally:
        store.close()


@pytest.mark.integration
def test_cli_refuses_a_bad_tenant(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["keys", "create", "--tenant", "a b", "--database-url", f"sqlite:///{tmp_path}/k.db"]
    )
    assert result.exit_code == 2 and "invalid tenant" in result.output


@pytest.mark.integration
async def test_authenticator_follows_the_table(key_db: tuple[str, str]) -> None:
    url, tenant = key_db
    store = KeyStore(url)
    clock = [0.0]
    auth = Authenticator(store, refresh_s=5.0, now=lambda: clock[0])
    try:
        key, info = store.create(tenant)
        assert await auth.authenticate(f"Bearer {key}") == tenant
        store.revoke(info.prefix)
        assert await auth.authenticate(f"Bearer {key}") == tenant  # cached until the next refresh...
        clock[0] += 5.0
        with pytest.raises(Exception, match="invalid API key"):  # ...which drops it
            await auth.authenticate(f"Bearer {key}")
    finally:
        store.close()


@pytest.mark.unit
def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer cv-abc") == "cv-abc"
    assert bearer_token("bearer   cv-abc ") == "cv-abc"
    assert bearer_token("Basic dXNlcg==") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


@pytest.mark.integration
async def test_http_requires_keys_once_one_exists(make_stack: StackFactory, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    store = KeyStore(url)
    key, info = store.create("acme")
    stack = await make_stack(database_url=url)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=stack.url) as http:
        missing = await http.post("/v1/chat/completions", json=body)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert (missing.json()["error"]["type"], missing.json()["error"]["code"]) == (
            "authentication_error",
            "missing_api_key",
        )
        assert (await http.get("/v1/models")).status_code == 401
    with pytest.raises(openai.AuthenticationError) as caught:
        await stack.openai(api_key="cv-not-a-key").chat.completions.create(**body)
    assert caught.value.code == "invalid_api_key"
    assert stack.scheduler.schedule_calls == []
    await stack.records.assert_none()

    reply = await stack.openai(api_key=key).chat.completions.create(**body)
    assert reply.choices[0].message.content == "Hello, world!"
    assert (await stack.records.next()).tenant == "acme"

    store.revoke(info.prefix)
    await stack.server.frontend.auth.refresh()  # what the periodic reload does within key_refresh_s
    with pytest.raises(openai.AuthenticationError):
        await stack.openai(api_key=key).chat.completions.create(**body)
    store.close()


def _serve(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clairvoyant.gateway", "serve", *args],
        env={**os.environ, "CV_NATS_URL": "nats://127.0.0.1:1", "CV_GATEWAY_PORT": "0",
             "CV_GATEWAY_GRPC_PORT": "0", **env},
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("url", "masked", "cause"),
    [
        ("postgresql://nobody:hunter22@127.0.0.1:{port}/x", "postgresql://nobody:***@127.0.0.1:{port}/x",
         "Connection refused"),
        ("garbage", "garbage", "Could not parse SQLAlchemy URL"),
        ("mysql://cv:hunter22@127.0.0.1/x", "mysql://cv:***@127.0.0.1/x", "No module named"),
    ],
)
def test_serve_with_a_bad_database_url_says_so_in_one_paragraph(
    url: str, masked: str, cause: str, tmp_path: Path, free_port: int
) -> None:
    run = _serve({"CV_DATABASE_URL": url.format(port=free_port)}, tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr  # one paragraph, no traceback
    assert lines[0].startswith(f"error: cannot use the API key database CV_DATABASE_URL={masked.format(port=free_port)}: ")
    assert cause in lines[0] and "hunter22" not in run.stderr + run.stdout


@pytest.mark.integration
def test_serve_help_lists_every_setting(tmp_path: Path) -> None:
    run = _serve({"COLUMNS": "200"}, tmp_path, "--help")
    assert run.returncode == 0, run.stderr
    lines = [line.strip() for line in run.stdout.splitlines()]
    for expected in (
        "CV_DATABASE_URL=sqlite:///var/gateway.db  API keys (SQLAlchemy URL)",
        "CV_RATE_LIMIT_RPM=0  requests per minute per API key, unless the key sets its own; 0: unlimited",
        "CV_GATEWAY_PORT=8000  OpenAI-compatible HTTP API; 0 picks a free port",
        "CV_NATS_PASSWORD (unset)  NATS password",
        "CV_LOG_JSON=true",
    ):
        assert any(line.startswith(expected) for line in lines), expected
    listed = [line.split("=")[0].split(" ")[0] for line in lines if line.startswith("CV_")]
    assert listed == [f"CV_{name.upper()}" for name in GatewaySettings.model_fields]
