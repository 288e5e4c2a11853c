"""Command line: ``python -m clairvoyant.gateway [serve]`` and ``... keys create|list|limits|revoke``.

The key commands talk to the database directly (``CV_DATABASE_URL`` or ``--database-url``); a
running gateway picks up changes within ``CV_KEY_REFRESH_S`` seconds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Annotated, NoReturn

import typer
from pydantic import BaseModel, SecretStr, ValidationError
from rich.markup import escape
from sqlalchemy.exc import ArgumentError

from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.gateway.keys import DatabaseError, KeyInfo, KeyStore, describe_database_error

app = typer.Typer(
    add_completion=False, help="Clairvoyant gateway: OpenAI-compatible HTTP and gRPC front door."
)
keys_app = typer.Typer(add_completion=False, help="Manage API keys (each maps to a tenant).")
app.add_typer(keys_app, name="keys")

DatabaseUrl = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL (default: $CV_DATABASE_URL or the settings default)"),
]


def settings_help(settings: type[BaseModel], prefix: str = "CV_") -> str:
    """One line per setting, ``CV_NAME=default  description`` (``CV_NAME (unset)`` for secrets and
    other settings without a default value)."""
    lines = []
    for name, field in settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        variable = f"{prefix}{name.upper()}"
        if isinstance(default, SecretStr) or default is None:
            shown = f"{variable} (unset)"
        elif isinstance(default, bool):
            shown = f"{variable}={str(default).lower()}"
        else:
            shown = f"{variable}={default}"
        lines.append(f"{shown}  {field.description}" if field.description else shown)
    return "\n".join(lines)


def load_settings() -> GatewaySettings:
    """The settings from CV_* variables; exits with one paragraph (no traceback) when they are bad."""
    try:
        return GatewaySettings.from_env()
    except ValidationError as err:  # values are hidden from the message (hide_input_in_errors)
        sys.exit(f"error: invalid gateway settings (CV_* variables):\n{err}")
    except ArgumentError as err:  # the settings check parses CV_DATABASE_URL as a SQLAlchemy URL
        sys.exit(f"error: {describe_database_error(os.environ.get('CV_DATABASE_URL', ''), err)}")


def _store(database_url: str | None) -> KeyStore:
    if database_url:
        return KeyStore(database_url, setting="--database-url")
    return KeyStore(load_settings().database_url)


def create_key(
    database_url: str | None, tenant: str, rpm: int | None = None, tpm: int | None = None
) -> tuple[str, KeyInfo]:
    """Create a key for ``tenant``; returns the key (shown once, never stored) and its record."""
    store = _store(database_url)
    try:
        return store.create(tenant, rpm=rpm, tpm=tpm)
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


def set_key_limits(database_url: str | None, prefix: str, changes: Mapping[str, int | None]) -> KeyInfo:
    store = _store(database_url)
    try:
        return store.set_limits(prefix, changes)
    finally:
        store.close()


def describe_limits(info: KeyInfo) -> str:
    def shown(value: int | None) -> str:
        return "default" if value is None else ("unlimited" if value == 0 else str(value))

    return f"rpm {shown(info.rpm)}, tpm {shown(info.tpm)}"


_UNCHANGED = object()


def parse_limit(value: str | None, option: str) -> int | None | object:
    """``--rpm``/``--tpm`` of ``keys limits``: a number (0: unlimited), "default" (None), or not
    given (``_UNCHANGED``)."""
    if value is None:
        return _UNCHANGED
    if value.strip().lower() == "default":
        return None
    if not value.strip().isdigit():
        raise typer.BadParameter(
            f"{value!r} is neither a number (0: unlimited) nor 'default'", param_hint=option
        )
    return int(value)


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        serve()


@app.command(
    epilog="Settings, from environment variables:\n\n\b\n" + escape(settings_help(GatewaySettings)),
)
def serve() -> None:
    """Serve HTTP and gRPC until SIGINT/SIGTERM (the default command)."""
    settings = load_settings()
    try:  # open the key database first: a bad CV_DATABASE_URL is one paragraph, not a traceback
        KeyStore(settings.database_url).close()
    except DatabaseError as err:
        sys.exit(f"error: {err}")
    from clairvoyant.gateway.app import run  # uvicorn and grpc only when serving

    run(settings)


def _fail(err: Exception) -> NoReturn:
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(1)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="tenant the key acts for")],
    rpm: Annotated[
        int | None,
        typer.Option("--rpm", min=0, help="requests per minute (0: unlimited; default: CV_RATE_LIMIT_RPM)"),
    ] = None,
    tpm: Annotated[
        int | None,
        typer.Option("--tpm", min=0, help="tokens per minute (0: unlimited; default: CV_RATE_LIMIT_TPM)"),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a key and print it once (only its hash is stored)."""
    try:
        key, info = create_key(database_url, tenant, rpm=rpm, tpm=tpm)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tenant") from None
    except DatabaseError as exc:
        _fail(exc)
    typer.echo(
        f"created key {info.prefix}... for tenant {info.tenant!r} ({describe_limits(info)}); "
        "it is shown only now:",
        err=True,
    )
    typer.echo(key)


@keys_app.command("list")
def keys_list(database_url: DatabaseUrl = None) -> None:
    """List keys by display prefix (never the key itself), with their rate limits."""
    try:
        keys = list_keys(database_url)
    except DatabaseError as exc:
        _fail(exc)
    for info in keys:
        state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M:%S}" if info.revoked_at else "active"
        typer.echo(
            f"{info.prefix}  {info.tenant:<24} created {info.created_at:%Y-%m-%d %H:%M:%S}  {state}  "
            f"{describe_limits(info)}"
        )


@keys_app.command("limits")
def keys_limits(
    prefix: Annotated[str, typer.Argument(help="the key's 8-character prefix, or the whole key")],
    rpm: Annotated[
        str | None,
        typer.Option(
            "--rpm", help="requests per minute: a number (0: unlimited) or 'default' (CV_RATE_LIMIT_RPM)"
        ),
    ] = None,
    tpm: Annotated[
        str | None,
        typer.Option(
            "--tpm", help="tokens per minute: a number (0: unlimited) or 'default' (CV_RATE_LIMIT_TPM)"
        ),
    ] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Change a key's rate limits; a running gateway applies them within CV_KEY_REFRESH_S seconds."""
    changes: dict[str, int | None] = {
        name: value  # type: ignore[misc]
        for name, value in (("rpm", parse_limit(rpm, "--rpm")), ("tpm", parse_limit(tpm, "--tpm")))
        if value is not _UNCHANGED
    }
    if not changes:
        raise typer.BadParameter("give --rpm, --tpm or both", param_hint="--rpm/--tpm")
    try:
        info = set_key_limits(database_url, prefix, changes)
    except (LookupError, DatabaseError) as exc:
        _fail(exc)
    typer.echo(f"{info.prefix}... (tenant {info.tenant!r}): {describe_limits(info)}")


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="the key's 8-character prefix, or the whole key")],
    database_url: DatabaseUrl = None,
) -> None:
    """Revoke a key; a running gateway refuses it within CV_KEY_REFRESH_S seconds."""
    try:
        info = revoke_key(database_url, prefix)
    except (LookupError, DatabaseError) as exc:
        _fail(exc)
    typer.echo(f"revoked {info.prefix}... (tenant {info.tenant!r})")
