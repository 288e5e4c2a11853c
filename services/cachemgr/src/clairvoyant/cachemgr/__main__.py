"""Start the cache manager: ``python -m clairvoyant.cachemgr [--policy NAME] [--preset NAME] [--port N]``."""

from __future__ import annotations

import argparse
import asyncio
import sys

from pydantic import ValidationError

from clairvoyant.cachemgr.app import CacheManagerApp
from clairvoyant.cachemgr.config import CacheManagerSettings
from clairvoyant.core.lifecycle import serve_until_signal
from clairvoyant.core.logs import setup_logging
from clairvoyant.core.metrics import serve_metrics
from clairvoyant.core.processes import follow_parent
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.policy import CACHE_POLICIES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.cachemgr",
        description="Clairvoyant cache manager: indexes the workers' KV blocks and directs their caches. "
        "Settings come from CV_* environment variables (see docs/cache-manager.md); these flags override them.",
    )
    parser.add_argument("--policy", choices=CACHE_POLICIES.names(), help="cache policy (CV_CACHEMGR_POLICY)")
    parser.add_argument("--preset", help="the preset whose cache policy runs (CV_CACHEMGR_PRESET)")
    parser.add_argument("--port", type=int, help="gRPC port (CV_CACHEMGR_PORT, default 50053)")
    return parser


def load_settings(argv: list[str] | None = None) -> CacheManagerSettings:
    args = build_parser().parse_args(argv)
    flags = {"cachemgr_policy": args.policy, "cachemgr_preset": args.preset, "cachemgr_port": args.port}
    return CacheManagerSettings(**{k: v for k, v in flags.items() if v is not None})


async def serve(settings: CacheManagerSettings) -> None:
    serve_metrics(settings.host, settings.metrics_port)
    await serve_until_signal(CacheManagerApp(settings))


def main(argv: list[str] | None = None) -> None:
    follow_parent()  # started by the stack launcher: stop when it dies
    try:
        settings = load_settings(argv)
    except ValidationError as err:  # a bad CV_* value: say which, without a traceback
        sys.exit(f"invalid cache manager settings:\n{err}")
    setup_logging("cachemgr", settings.log_level, settings.log_json)
    setup_tracing("cachemgr")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
