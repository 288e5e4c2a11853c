"""Start a worker: ``python -m clairvoyant.worker [--runner R] [--model M] [--grpc-port P] [--http-port P]``.

Loads the model (``--runner emulated --gpu G --tp N``: a cost model of it on G, see
docs/costmodel.md), starts the engine thread, the gRPC Worker service (with grpc.health.v1), the
OpenAI-compatible HTTP endpoint and the stats heartbeat on NATS.  SIGINT/SIGTERM stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal

import torch
import uvicorn

from clairvoyant.contracts.v1 import worker_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import EventBus
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.core.logs import setup_logging
from clairvoyant.core.registry import Registry
from clairvoyant.core.telemetry import setup_tracing
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.costmodel.gpus import GPUS
from clairvoyant.worker.costmodel.models import MODELS
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.http_api import create_app
from clairvoyant.worker.rules import preset_rule
from clairvoyant.worker.runners.base import ModelRunner, SizesOwnKvPool
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner
from clairvoyant.worker.service import WorkerService, record_stats

logger = logging.getLogger("clairvoyant.worker")

RUNNERS: Registry[ModelRunner] = Registry("runner")  # name -> factory(settings)


@RUNNERS.register("torch")
def _torch_runner(settings: WorkerSettings) -> ModelRunner:
    return load_runner(settings.model, device=settings.device, max_model_len=settings.max_model_len)


@RUNNERS.register("emulated")
def _emulated_runner(settings: WorkerSettings) -> ModelRunner:
    return EmulatedRunner(
        settings.model,
        settings.gpu,
        settings.tensor_parallel,
        max_model_len=settings.max_model_len,
        absorb_host_time=True,
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside our event loop: signals belong to ``serve()``, not to uvicorn."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        return contextlib.nullcontext()


def engine_config(settings: WorkerSettings, runner: ModelRunner) -> EngineConfig:
    num_blocks = settings.num_blocks
    if not num_blocks and isinstance(runner, SizesOwnKvPool):
        num_blocks = runner.default_num_blocks(settings.block_size) or 0
    if not num_blocks:
        block_bytes = runner.kv_bytes_per_token() * settings.block_size
        num_blocks = max(16, settings.kv_cache_mb * 1024 * 1024 // block_bytes)
    return EngineConfig(
        block_size=settings.block_size,
        num_blocks=num_blocks,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        enable_prefix_cache=settings.enable_prefix_cache,
        aging_rate=settings.aging_rate,
    )


def build_engine(runner: ModelRunner, config: EngineConfig) -> LLMEngine:
    """The engine core; each request's scheduler preset picks its ranking rule (``rules``)."""
    engine = LLMEngine(runner, config)
    engine.scheduler.rule_factory = preset_rule
    return engine


async def serve(settings: WorkerSettings) -> None:
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    logger.info("loading model %s (runner %s)", settings.model, settings.runner)
    runner = RUNNERS.create(settings.runner, settings=settings)
    config = engine_config(settings, runner)
    engine = AsyncEngine(build_engine(runner, config), on_step=record_stats)
    engine.start()
    worker_id = settings.resolved_worker_id()

    tls = security.configure(settings)  # the bus connects with its credentials too
    server = new_server()
    port = bind(server, f"{settings.host}:{settings.worker_grpc_port}", tls)
    grpc_address = f"{settings.advertised()}:{port}"
    http_address = f"http://{settings.advertised()}:{settings.worker_http_port}" if settings.worker_http_port else ""
    heartbeat = Heartbeat(settings, runner, engine, grpc_address, http_address)
    service = WorkerService(runner, engine, worker_id)
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkerServicer(service, heartbeat), server)
    health = add_health(server, ["clairvoyant.v1.Worker"])
    await server.start()
    await mark_serving(health, ["clairvoyant.v1.Worker"])

    http: uvicorn.Server | None = None
    tasks: list[asyncio.Task[None]] = []
    if settings.worker_http_port:
        http = _EmbeddedServer(
            uvicorn.Config(
                create_app(service, heartbeat),
                host=settings.host,
                port=settings.worker_http_port,
                log_level="warning",
                lifespan="off",
            )
        )
        tasks.append(asyncio.create_task(http.serve()))

    bus = EventBus(settings.nats_url, f"worker-{worker_id}", connect_timeout_s=settings.nats_connect_timeout_s)
    await bus.connect()
    tasks.append(asyncio.create_task(heartbeat.run(bus)))
    logger.info(
        "worker %s serving %s: grpc %s, http %s, %d KV blocks of %d tokens, batch %d",
        worker_id, runner.info.name, grpc_address, http_address or "off",
        config.num_blocks, config.block_size, config.max_num_seqs,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    logger.info("worker %s stopping", worker_id)
    heartbeat.draining = True
    await mark_serving(health, ["clairvoyant.v1.Worker"], serving=False)
    if http is not None:
        http.should_exit = True
    await server.stop(grace=2.0)
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await bus.close()
    engine.stop()


def main(argv: list[str] | None = None) -> None:
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
    args = parser.parse_args(argv)
    overrides = {
        "runner": args.runner,
        "model": args.model,
        "gpu": args.gpu,
        "tensor_parallel": args.tp,
        "worker_grpc_port": args.grpc_port,
        "worker_http_port": args.http_port,
        "worker_id": args.worker_id,
    }
    settings = WorkerSettings(**{k: v for k, v in overrides.items() if v is not None})
    setup_logging("worker", settings.log_level, settings.log_json)
    setup_tracing("worker")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
