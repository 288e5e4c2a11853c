"""Start the autoscaler: ``python -m clairvoyant.autoscaler [--policy NAME] [--port N]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import ValidationError

from clairvoyant.autoscaler.app import AutoscalerApp
from clairvoyant.autoscaler.config import AutoscalerSettings
from clairvoyant.core.lifecycle import serve_until_signal
from clairvoyant.core.logs import setup_logging
from clairvoyant.core.metrics import serve_metrics
from clairvoyant.core.processes import follow_parent
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.policy import SCALING_POLICIES

logger = logging.getLogger("clairvoyant.autoscaler")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.autoscaler",
        description="Clairvoyant autoscaler: adds and drains worker replicas per model ahead of demand. "
        "Settings come from CV_* environment variables (see docs/autoscaling.md); these flags override them.",
    )
    parser.add_argument(
        "--policy", choices=SCALING_POLICIES.names(), help="scaling policy (CV_SCALING_POLICY)"
    )
    parser.add_argument("--port", type=int, help="gRPC port (CV_AUTOSCALER_PORT, default 50054)")
    parser.add_argument("--actuator", help="local | docker | kubernetes (CV_ACTUATOR)")
    parser.add_argument("--gpu-budget", type=int, help="GPUs all replicas may hold (CV_GPU_BUDGET)")
    return parser


def load_settings(argv: list[str] | None = None) -> AutoscalerSettings:
    args = build_parser().parse_args(argv)
    flags = {"scaling_policy": args.policy, "autoscaler_port": args.port, "actuator": args.actuator,
             "gpu_budget": args.gpu_budget}  # fmt: skip
    return AutoscalerSettings(**{k: v for k, v in flags.items() if v is not None})


async def serve(settings: AutoscalerSettings) -> None:
    serve_metrics(settings.host, settings.metrics_port)
    await serve_until_signal(AutoscalerApp(settings))


def main(argv: list[str] | None = None) -> None:
    follow_parent()  # started by the stack launcher: stop when it dies
    try:
        settings = load_settings(argv)
    except ValidationError as err:  # a bad CV_* value: say which, without a traceback
        sys.exit(f"invalid autoscaler settings:\n{err}")
    setup_logging("autoscaler", settings.log_level, settings.log_json)
    setup_tracing("autoscaler")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
