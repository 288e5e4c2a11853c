"""Command line: ``python -m clairvoyant.gateway [serve]`` and ``... keys create|list|revoke``.

The key commands talk to the database directly (``CV_DATABASE_URL`` or ``--database-url``); a
running gateway picks up changes within ``CV_KEY_REFRESH_S`` seconds.
"""

from __future__ import annotations

from typing import Annotated

import typer

from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.keys import KeyInfo, KeyStore

app = typer.Typer(
    add_completion=False, help="Clairvoyant gateway: OpenAI-compatible HTTP and gRPC front door."
)
keys_app = typer.Typer(add_completion=False, help="Manage API keys (each maps to a tenant).")
app.add_typer(keys_app, name="keys")

DatabaseUrl = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL (default: $CV_DATABASE_URL or the settings default)"),
]


def _store(database_url: str | None) -> KeyStore:
    return KeyStore(database_url or GatewaySettings.from_env().database_url)


def create_key(database_url: str | None, tenant: str) -> tuple[str, KeyInfo]:
    """Create a key for ``tenant``; returns the key (shown once, never stored) and its record."""
    store = _store(database_url)
    try:
        return store.create(tenant)
    finally:
        store.close()


def list_keys(database_url: str | None) -> list[KeyInfo]:
    store = _store(database_url)
    try:
        return store.list()
    finally:
        store.close()


def revoke_key(database_url: str | None, prefix: str) -> KeyInfo:
    store = _store(database_url)
    try:
        return store.revoke(prefix)
    finally:
        store.close()


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        serve()


@app.command()
def serve() -> None:
    """Serve HTTP and gRPC until SIGINT/SIGTERM (the default command)."""
    from clairvoyant.gateway.server import run  # uvicorn and grpc only when serving

    run(GatewaySettings.from_env())


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="tenant the key acts for")],
    database_url: DatabaseUrl = None,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    try:
        key, info = create_key(database_url, tenant)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenant") from None
    typer.echo(f"created key {info.prefix}... for tenant {info.tenant!r}; it is shown only now:", err=True)
    typer.echo(key)


@keys_app.command("list")
def keys_list(database_url: DatabaseUrl = None) -> None:
    """List keys by display prefix (never the key itself)."""
    for info in list_keys(database_url):
        state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M:%S}" if info.revoked_at else "active"
        typer.echo(f"{info.prefix}  {info.tenant:<24} created {info.created_at:%Y-%m-%d %H:%M:%S}  {state}")


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="the key's 8-character prefix, or the whole key")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a key; a running gateway refuses it within CV_KEY_REFRESH_S seconds."""
    try:
        info = revoke_key(database_url, prefix)
    except LookupError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"revoked {info.prefix}... (tenant {info.tenant!r})")
