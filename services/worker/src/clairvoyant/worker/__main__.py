"""Start a worker: ``python -m clairvoyant.worker [--runner R] [--model M] [--grpc-port P] [--http-port P]``.

Loads the model (``--runner emulated --gpu G --tp N``: a cost model of it on G, see
docs/costmodel.md), starts the engine thread, the gRPC Worker service (with grpc.health.v1), the
OpenAI-compatible HTTP endpoint and the stats heartbeat on NATS.  SIGINT/SIGTERM stop it cleanly.
``--engine vllm`` (or ``CV_ENGINE=vllm``) fronts a vLLM server instead, started by the worker
(``make install-vllm``); ``sglang`` an SGLang server.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from clairvoyant.core.logs import setup_logging
from clairvoyant.core.processes import follow_parent
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.worker.app import RUNNERS, WorkerApp
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.costmodel.gpus import GPUS
from clairvoyant.worker.costmodel.models import MODELS
from clairvoyant.worker.engines.app import ExternalWorkerApp


async def serve(settings: WorkerSettings) -> None:
    worker: WorkerApp | ExternalWorkerApp
    worker = WorkerApp(settings) if settings.engine == "clairvoyant" else ExternalWorkerApp(settings)
    await worker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.stop()


def main(argv: list[str] | None = None) -> None:
    follow_parent()  # started by the autoscaler's local actuator: stop when it dies
    parser = argparse.ArgumentParser(prog="python -m clairvoyant.worker", description=__doc__)
    parser.add_argument("--runner", choices=RUNNERS.names(), help="model runner (default torch)")
    parser.add_argument(
        "--model",
        help="tiny-random | smollm2-135m-instruct | path to .gguf | HF checkpoint dir; "
        f"emulated: {' | '.join(MODELS)}",
    )
    parser.add_argument("--gpu", choices=[spec.name for spec in GPUS.values()], help="emulated runner's GPU")
    parser.add_argument("--tp", type=int, help="emulated runner's tensor-parallel degree")
    parser.add_argument("--grpc-port", type=int)
    parser.add_argument("--http-port", type=int)
    parser.add_argument("--worker-id")
    parser.add_argument(
        "--engine", choices=("clairvoyant", "vllm", "sglang"), help="front a vLLM or SGLang server (docs/engines.md)"
    )
    args = parser.parse_args(argv)
    overrides = {
        "runner": args.runner,
        "model": args.model,
        "gpu": args.gpu,
        "tensor_parallel": args.tp,
        "worker_grpc_port": args.grpc_port,
        "worker_http_port": args.http_port,
        "worker_id": args.worker_id,
        "engine": args.engine,
    }
    settings = WorkerSettings(**{k: v for k, v in overrides.items() if v is not None})
    setup_logging("worker", settings.log_level, settings.log_json)
    setup_tracing("worker")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
