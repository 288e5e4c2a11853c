"""Start the scheduler: ``python -m clairvoyant.scheduler [--policy NAME] [--port N]``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from pydantic import ValidationError
from threadpoolctl import threadpool_limits

from clairvoyant.core.lifecycle import serve_until_signal
from clairvoyant.core.logs import setup_logging
from clairvoyant.core.metrics import serve_metrics
from clairvoyant.core.model_groups import ModelGroupError
from clairvoyant.core.processes import follow_parent
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.policy import PRESETS
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.scheduler.model_groups import SchedulerPolicies, build_scheduler_policies

# A start-up refusal of a bad model-groups declaration (CV_MODEL_GROUPS) or router profile.
EXIT_BAD_MODEL_GROUPS = 2

logger = logging.getLogger("clairvoyant.scheduler")


def build_parser() -> argparse.ArgumentParser:
    presets = ", ".join(
        f"{name} ({PRESETS.create(name).priority} + {PRESETS.create(name).routing})" for name in PRESETS
    )
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.scheduler",
        description="Clairvoyant scheduler: global queues per model, priority and routing across workers. "
        "Settings come from CV_* environment variables; these flags override them.",
    )
    parser.add_argument("--policy", choices=PRESETS.names(), help=f"scheduler preset: {presets}")
    parser.add_argument("--port", type=int, help="gRPC port (CV_SCHEDULER_PORT, default 50051)")
    return parser


def load_settings(argv: list[str] | None = None) -> SchedulerSettings:
    args = build_parser().parse_args(argv)
    overrides = {
        k: v for k, v in {"policy": args.policy, "scheduler_port": args.port}.items() if v is not None
    }
    return SchedulerSettings(**overrides)  # flags win over CV_* variables, which win over defaults


async def serve(settings: SchedulerSettings, policies: SchedulerPolicies) -> None:
    serve_metrics(settings.host, settings.metrics_port)
    await serve_until_signal(SchedulerApp(settings, policies=policies))


def one_blas_thread() -> None:
    """One BLAS thread unless the operator chose (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS): the
    classifier routers of the model-choosing presets run small matrix products at submit, and on a
    shared machine a thread pool made one 243-configuration batch take 0.2-8 ms instead of 0.2."""
    if not any(os.environ.get(name) for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")):
        import numpy  # noqa: F401  (loads its BLAS, so that the limit reaches it)

        threadpool_limits(limits=1, user_api="blas")


def main(argv: list[str] | None = None) -> None:
    follow_parent()  # started by the stack launcher: stop when it dies
    try:
        settings = load_settings(argv)
    except ValidationError as err:  # a bad CV_* value: say which, without a traceback
        sys.exit(f"invalid scheduler settings:\n{err}")
    try:
        policies = build_scheduler_policies(settings.policy, settings.model_groups)
    except ModelGroupError as err:  # before serving: a declaration nobody can use is a bad setting
        print(f"invalid model groups (CV_MODEL_GROUPS): {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_MODEL_GROUPS)
    one_blas_thread()  # after the routers loaded (the limit reaches the libraries loaded so far)
    setup_logging("scheduler", settings.log_level, settings.log_json)
    setup_tracing("scheduler")
    asyncio.run(serve(settings, policies))


if __name__ == "__main__":
    main()
