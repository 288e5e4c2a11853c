"""The worker's wiring: loads the model runner, builds the engine and its loop thread, the gRPC
Worker service (``grpc_api``, with grpc.health.v1), the OpenAI-compatible HTTP endpoint
(``http_api``), the stats heartbeat and the KV events on NATS, and the cache directives from gRPC
and NATS; starts them and stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import torch
import uvicorn

from clairvoyant.contracts.v1 import worker_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import EventBus
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.core.logs import mask_url
from clairvoyant.core.registry import Registry
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.core.engine import EngineConfig, LLMEngine
from clairvoyant.worker.core.grammar import DEFAULT_CACHE_SIZE, GrammarCache
from clairvoyant.worker.core.l3 import L3Store
from clairvoyant.worker.core.tiers import Executor, TierConfig
from clairvoyant.worker.directives import DirectiveSubscriber
from clairvoyant.worker.engine_loop import AsyncEngine
from clairvoyant.worker.frontend import WorkerFrontend
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.http_api import create_app
from clairvoyant.worker.kv_events import KvEventPublisher
from clairvoyant.worker.metrics import record_stats
from clairvoyant.worker.rules import preset_rule
from clairvoyant.worker.runners.base import HoldsHostKv, ModelRunner, SizesOwnKvPool
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.worker.runners.loader import load_runner

logger = logging.getLogger("clairvoyant.worker")
GIB = 1 << 30

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
        tiers=TierConfig(
            num_host_blocks=host_cache_blocks(settings, runner, num_blocks),
            write_policy=settings.l3_write_policy,
            prefetch_policy=settings.l3_prefetch_policy,
            prefetch_threshold_tokens=settings.l3_prefetch_threshold_tokens,
            prefetch_timeout_base_s=settings.l3_prefetch_timeout_base_s,
            prefetch_timeout_per_ki_token_s=settings.l3_prefetch_timeout_per_ki_token_s,
        ),
    )


def host_cache_blocks(settings: WorkerSettings, runner: ModelRunner, num_blocks: int) -> int:
    """The L2 pool in blocks: ``host_cache_gb`` when set, else ``host_cache_ratio`` x the L1 pool;
    0 when disabled or when the runner or the engine cannot have one."""
    if not settings.host_cache_enabled:
        return 0
    if not settings.enable_prefix_cache or not isinstance(runner, HoldsHostKv):
        why = "needs the prefix cache" if not settings.enable_prefix_cache else f"is not kept by {settings.runner}"
        logger.warning("host KV cache (L2) %s: running without L2 and L3", why)
        return 0
    if settings.host_cache_gb > 0:
        block_bytes = runner.kv_bytes_per_token() * settings.block_size
        return int(settings.host_cache_gb * GIB // block_bytes)
    return int(settings.host_cache_ratio * num_blocks)


def open_l3_store(settings: WorkerSettings) -> L3Store | None:
    """The L3 store ``l3_url`` names, or None (none set, or it cannot be reached: a dead store
    degrades the worker to L1 and L2, it does not stop it).  Raises ValueError for a bad URL."""
    url = settings.l3_url
    if not url:
        return None
    from clairvoyant.worker.l3 import open_l3  # the backends' client libraries load on demand

    try:
        return open_l3(url, timeout_s=settings.l3_timeout_s)
    except ValueError:  # a malformed URL is a configuration error: refuse to start
        raise
    except Exception as exc:
        logger.warning("L3 %s cannot be opened (%s): running without L3", mask_url(url), exc)
        return None


def describe_l3(store: L3Store | None, url: str) -> str:
    if store is None:
        return "none"
    parts = urlsplit(url)
    where = parts.path if parts.scheme == "file" else mask_url(url)
    return f"{store.name} {where}".strip()


def build_engine(
    runner: ModelRunner,
    config: EngineConfig,
    *,
    l3: L3Store | None = None,
    executor: Executor | None = None,
    kv_events: bool = False,
    grammar_cache_size: int = DEFAULT_CACHE_SIZE,
) -> LLMEngine:
    """The engine core; each request's scheduler preset picks its ranking rule (``rules``)."""
    grammars = GrammarCache(runner.tokenizer, runner.info, grammar_cache_size)
    engine = LLMEngine(runner, config, l3=l3, executor=executor, kv_events=kv_events, grammars=grammars)
    engine.scheduler.rule_factory = preset_rule
    return engine


SERVICE_NAME = "clairvoyant.v1.Worker"


class WorkerApp:
    """One worker process.  ``start`` loads the model and serves; ``stop`` drains and closes."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.worker_id = settings.resolved_worker_id()
        self._http: uvicorn.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._l3: L3Store | None = None
        self._l3_executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        settings = self.settings
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        logger.info("loading model %s (runner %s)", settings.model, settings.runner)
        runner = RUNNERS.create(settings.runner, settings=settings)
        config = engine_config(settings, runner)
        if config.tiers.num_host_blocks:
            self._l3 = open_l3_store(settings)
        if self._l3 is not None:
            self._l3_executor = ThreadPoolExecutor(1, thread_name_prefix="kv-l3")
        host_blocks = config.tiers.num_host_blocks
        host_gib = host_blocks * runner.kv_bytes_per_token() * config.block_size / GIB
        logger.info(
            "L2: %d host KV blocks (%.2f GiB); L3: %s", host_blocks, host_gib, describe_l3(self._l3, settings.l3_url)
        )
        self.kv_events = (
            KvEventPublisher(self.worker_id, runner.info.name, settings.block_size) if settings.kv_events else None
        )
        core = build_engine(
            runner, config, l3=self._l3, executor=self._l3_executor, kv_events=self.kv_events is not None,
            grammar_cache_size=settings.grammar_cache_size,
        )  # fmt: skip
        self.engine = AsyncEngine(
            core, on_step=record_stats, on_kv_events=self.kv_events.submit if self.kv_events else None
        )
        self.engine.start()

        tls = security.configure(settings)  # the bus connects with its credentials too
        self.server = new_server()
        port = bind(self.server, f"{settings.host}:{settings.worker_grpc_port}", tls)
        grpc_address = f"{settings.advertised()}:{port}"
        http_address = (
            f"http://{settings.advertised()}:{settings.worker_http_port}" if settings.worker_http_port else ""
        )
        self.heartbeat = Heartbeat(settings, runner, self.engine, grpc_address, http_address)
        frontend = WorkerFrontend(
            runner, self.engine, self.worker_id, compile_threads=settings.grammar_compile_threads
        )
        servicer = WorkerServicer(frontend, self.heartbeat, tool_format=settings.tool_call_format)
        worker_pb2_grpc.add_WorkerServicer_to_server(servicer, self.server)
        self.health = add_health(self.server, [SERVICE_NAME])
        await self.server.start()
        await mark_serving(self.health, [SERVICE_NAME])

        if settings.worker_http_port:
            self._http = _EmbeddedServer(
                uvicorn.Config(
                    create_app(frontend, self.heartbeat),
                    host=settings.host,
                    port=settings.worker_http_port,
                    log_level="warning",
                    lifespan="off",
                )
            )
            self._tasks.append(asyncio.create_task(self._http.serve()))

        self.bus = EventBus(
            settings.nats_url, f"worker-{self.worker_id}", connect_timeout_s=settings.nats_connect_timeout_s
        )
        await self.bus.connect()
        self._tasks.append(asyncio.create_task(self.heartbeat.run(self.bus)))
        if self.kv_events is not None:
            self._tasks.append(asyncio.create_task(self.kv_events.run(self.bus)))
            await self.kv_events.resync_on_request(self.bus, self.engine)
        await DirectiveSubscriber(frontend.apply_directives, self.worker_id).subscribe(self.bus)
        logger.info(
            "worker %s serving %s: grpc %s, http %s, %d KV blocks of %d tokens, batch %d",
            self.worker_id, runner.info.name, grpc_address, http_address or "off",
            config.num_blocks, config.block_size, config.max_num_seqs,
        )

    async def stop(self) -> None:
        logger.info("worker %s stopping", self.worker_id)
        self.heartbeat.draining = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        if self._http is not None:
            self._http.should_exit = True
        await self.server.stop(grace=2.0)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()
        self.engine.stop()
        if self._l3_executor is not None:  # the queued L3 writes finish: other workers may use them
            await asyncio.to_thread(self._l3_executor.shutdown, wait=True)
        if self._l3 is not None:
            self._l3.close()
