"""Command line: ``python -m clairvoyant.profiler [serve]``, ``show``, ``evaluate``.

``show`` reads a profile straight from the database (``CV_DATABASE_URL`` or ``--database-url``),
so it works beside a running profiler or without one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from clairvoyant.profiler.config import ProfilerSettings

logger = logging.getLogger("clairvoyant.profiler")

app = typer.Typer(
    add_completion=False,
    help="Clairvoyant profiler: learns workflow structure from completed requests and annotates new ones.",
)


def _settings(**overrides: Any) -> ProfilerSettings:
    """The settings from CV_* variables; exits with one paragraph (no traceback) when they are bad."""
    try:
        return ProfilerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:  # a bad CV_* value: say which, without a traceback
        for error in err.errors():
            if error["loc"] == ("database_url",):  # the same paragraph as a database that refuses
                from clairvoyant.profiler.persistence import describe_database_error

                sys.exit(f"error: {describe_database_error(error['input'], error['ctx']['error'])}")
        sys.exit(f"invalid profiler settings:\n{err}")  # values are hidden (hide_input_in_errors)


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        serve()


@app.command()
def serve(
    port: Annotated[int | None, typer.Option("--port", help="gRPC port (CV_PROFILER_PORT, default 50052)")] = None,
) -> None:
    """Consume cv.requests.completed and serve Annotate until SIGINT/SIGTERM (the default command)."""
    from clairvoyant.core.logs import setup_logging
    from clairvoyant.core.metrics import serve_metrics
    from clairvoyant.core.telemetry import setup_tracing
    from clairvoyant.profiler.persistence import DatabaseUnavailable

    settings = _settings(profiler_port=port)
    setup_logging("profiler", settings.log_level, settings.log_json)
    setup_tracing("profiler")
    serve_metrics(settings.host, settings.metrics_port)
    try:
        asyncio.run(_serve(settings))
    except DatabaseUnavailable as err:  # raised by start, before anything is served: one paragraph
        sys.exit(f"error: {err}")


async def _serve(settings: ProfilerSettings) -> None:
    from clairvoyant.profiler.app import ProfilerApp

    profiler = ProfilerApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await profiler.start()
    try:
        await stop.wait()
        logger.info("signal received; shutting down")
    finally:
        await profiler.stop()


@app.command()
def show(
    workflow_type: Annotated[str, typer.Argument(help="the workflow_type_id to show")],
    tenant: Annotated[str, typer.Option("--tenant", help="whose profile (the open gateway's is 'default')")] = (
        "default"
    ),
    png: Annotated[Path | None, typer.Option("--png", help="also draw the automaton into this PNG file")] = None,
    database_url: Annotated[
        str | None, typer.Option("--database-url", help="SQLAlchemy URL (default: $CV_DATABASE_URL)")
    ] = None,
) -> None:
    """Print a stored profile: path expression, tier, instances, per-agent table; optionally a drawing."""
    from rich.console import Console

    from clairvoyant.profiler.persistence import DatabaseUnavailable, ProfileRepository
    from clairvoyant.profiler.show import draw_automaton, print_profile

    console = Console()
    settings = _settings()
    # Log entries not yet in a snapshot are replayed with the service's learning settings.
    try:
        repository = ProfileRepository(
            database_url or settings.database_url,
            config=settings.profile_config(),
            setting="--database-url" if database_url else "CV_DATABASE_URL",
        )
    except DatabaseUnavailable as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    try:
        profile = repository.load(tenant, workflow_type)
        known = [p.workflow_type_id for p in repository.list(tenant)] if profile is None else []
    finally:
        repository.close()
    if profile is None:
        typer.echo(f"no profile of {workflow_type!r} for tenant {tenant!r}; known: {known or 'none'}", err=True)
        raise typer.Exit(1)
    print_profile(profile, console)
    if png is not None:
        draw_automaton(profile, png)
        console.print(f"automaton drawn to {png}")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False
)
def evaluate(ctx: typer.Context) -> None:
    """Score the predictions offline on recorded workflows (--data, --holdout, --seed, --out)."""
    try:
        from clairvoyant.profiler.evaluation.cli import main as evaluation_main
    except ImportError as exc:
        typer.echo(f"the evaluation module is not available: {exc}", err=True)
        raise typer.Exit(2) from None
    # Its parser is the whole profiler command line, so the subcommand's name goes first.
    raise typer.Exit(evaluation_main(["evaluate", *ctx.args]))
