"""A worker that fronts a peer engine (``CV_ENGINE=vllm`` or ``sglang``).

``start``:
1. binds the KV event socket (before the engine starts, so no event is lost);
2. starts the engine's server (``launch_command``) and waits for its health check, or uses the
   running one ``CV_ENGINE_URL`` names;
3. serves the gRPC Worker contract (``grpc_api.WorkerServicer`` over ``ExternalFrontend``), with
   grpc.health.v1;
4. publishes the heartbeat (the engine's metrics, each interval) and the translated KV events on
   NATS, answers ``cv.kv.resync`` from the mirror, and takes directives from NATS.

The worker's own OpenAI HTTP endpoint is not started: the engine's server is the worker's
``http_address`` (it speaks the OpenAI API itself).  ``stop`` drains, closes, and stops the engine
it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import socket
import sys
from pathlib import Path

import httpx
from nats.aio.msg import Msg

from clairvoyant.contracts.v1 import worker_pb2_grpc
from clairvoyant.core import security
from clairvoyant.core.bus import KV_RESYNC_SUBJECT, EventBus
from clairvoyant.core.grpcutil import add_health, bind, mark_serving, new_server
from clairvoyant.core.registry import Registry
from clairvoyant.worker.config import WorkerSettings
from clairvoyant.worker.directives import DirectiveSubscriber
from clairvoyant.worker.engines.adapter import EngineAdapter, LaunchSpec
from clairvoyant.worker.engines.frontend import ExternalFrontend, engine_model_info
from clairvoyant.worker.engines.kv_bridge import KvBridge, RecentRequests
from clairvoyant.worker.engines.process import EngineProcess, EngineStartError
from clairvoyant.worker.grpc_api import WorkerServicer
from clairvoyant.worker.heartbeat import Heartbeat
from clairvoyant.worker.kv_events import KvEventPublisher

logger = logging.getLogger("clairvoyant.worker")

ENGINES: Registry[EngineAdapter] = Registry("engine")


@ENGINES.register("vllm")
def _vllm() -> EngineAdapter:
    from clairvoyant.worker.engines.vllm import VllmAdapter

    return VllmAdapter()


@ENGINES.register("sglang")
def _sglang() -> EngineAdapter:
    from clairvoyant.worker.engines.sglang import SglangAdapter

    return SglangAdapter()


SERVICE_NAME = "clairvoyant.v1.Worker"
VLLM_VENV_PYTHON = Path("var/vllm-venv/bin/python")  # ``make install-vllm``


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


MODELS_DIR = Path("var/models")  # checkpoints ``make install-vllm`` writes, by served name


def engine_model(settings: WorkerSettings) -> str:
    """What the engine loads: ``engine_model``; else ``var/models/<model>`` when it exists; else
    ``model`` itself (a hub id or a path)."""
    if settings.engine_model:
        return settings.engine_model
    local = MODELS_DIR / settings.model
    return str(local.absolute()) if local.is_dir() else settings.model


def engine_python(settings: WorkerSettings) -> str:
    if settings.engine_python:
        return settings.engine_python
    if settings.engine == "vllm" and VLLM_VENV_PYTHON.exists():
        return str(VLLM_VENV_PYTHON.absolute())  # not resolve(): the venv is in the link
    return sys.executable


class ExternalWorkerApp:
    """One worker process in front of one engine server.  Same life cycle as ``WorkerApp``."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.worker_id = settings.resolved_worker_id()
        self.adapter = ENGINES.create(settings.engine)
        self.process: EngineProcess | None = None
        self.bridge: KvBridge | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        settings = self.settings
        # The engine this worker starts runs beside it: it is reached on loopback when the worker
        # binds every interface.
        host = settings.host if settings.host not in ("0.0.0.0", "::") else "127.0.0.1"
        self.kv_events = (
            KvEventPublisher(self.worker_id, settings.model, 16) if settings.kv_events else None
        )  # our re-hashed blocks are 16 tokens (clairvoyant.core.blockhash)
        recent = RecentRequests()
        kv_endpoint = ""  # where the engine's publisher connects
        if self.kv_events is not None:
            kv_port = settings.engine_kv_events_port or free_port(host)
            kv_endpoint = f"tcp://{host}:{kv_port}"
            # Bound on the worker's interface: an engine in another container connects from outside.
            self.bridge = KvBridge(f"tcp://{settings.host}:{kv_port}", self.kv_events.submit, recent.get)
            self.bridge.start()
        base_url = settings.engine_url.rstrip("/")
        if not base_url:
            base_url = await self._launch(host, kv_endpoint)
        elif kv_endpoint:
            reachable = f"tcp://{settings.advertised()}:{kv_endpoint.rsplit(':', 1)[1]}"
            logger.warning(
                "fronting the running engine at %s: it publishes KV events to us only if it was started "
                "with --kv-events-config endpoint %s", base_url, reachable,
            )  # fmt: skip
        self.client = httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(30.0, read=None))
        served = await self._served_model()
        max_model_len = settings.max_model_len or self.adapter.max_model_len(served) or 2048
        info = engine_model_info(settings.model, max_model_len)
        self.frontend = ExternalFrontend(
            self.adapter, self.client, self.worker_id, info, max_num_seqs=settings.max_num_seqs, recent=recent
        )
        await self.frontend.refresh()

        tls = security.configure(settings)
        self.server = new_server()
        port = bind(self.server, f"{settings.host}:{settings.worker_grpc_port}", tls)
        grpc_address = f"{settings.advertised()}:{port}"
        self.heartbeat = Heartbeat(
            settings, self.frontend, self.frontend, grpc_address, base_url,
            engine_name=self.adapter.name, unsupported_directives=self.adapter.unsupported_directives,
            block_size=self.frontend.engine_block_size or None,
        )  # fmt: skip
        worker_pb2_grpc.add_WorkerServicer_to_server(
            WorkerServicer(self.frontend, self.heartbeat, tool_format=self.settings.tool_call_format), self.server
        )
        self.health = add_health(self.server, [SERVICE_NAME])
        await self.server.start()
        await mark_serving(self.health, [SERVICE_NAME])

        self.bus = EventBus(
            settings.nats_url, f"worker-{self.worker_id}", connect_timeout_s=settings.nats_connect_timeout_s
        )
        await self.bus.connect()
        self._tasks.append(asyncio.create_task(self._poll_stats()))
        self._tasks.append(asyncio.create_task(self.heartbeat.run(self.bus)))
        if self.kv_events is not None:
            self._tasks.append(asyncio.create_task(self.kv_events.run(self.bus)))
            await self.bus.subscribe(KV_RESYNC_SUBJECT, self._resync)
        await DirectiveSubscriber(self.frontend.apply_directives, self.worker_id).subscribe(self.bus)
        logger.info(
            "worker %s fronting %s %s at %s: grpc %s, max_model_len %d, batch %d, KV events %s",
            self.worker_id, self.adapter.name, settings.model, base_url, grpc_address, max_model_len,
            settings.max_num_seqs, kv_endpoint or "off",
        )  # fmt: skip

    async def _launch(self, host: str, kv_endpoint: str) -> str:
        settings = self.settings
        # The engine's OpenAI endpoint is the worker's HTTP endpoint: it takes the worker's HTTP port.
        port = settings.engine_port or settings.worker_http_port or free_port(host)
        spec = LaunchSpec(
            python=engine_python(settings),
            model_path=engine_model(settings),
            served_name=settings.model,
            host=host,
            port=port,
            max_num_seqs=settings.max_num_seqs,
            max_model_len=settings.max_model_len,
            kv_events_endpoint=kv_endpoint,
            device=settings.device,
            extra_args=tuple(shlex.split(settings.engine_args)),
        )
        log_path = Path(settings.engine_log or f"var/engines/{self.worker_id}.log")
        argv = self.adapter.launch_command(spec)
        logger.info("starting %s: %s (log %s)", self.adapter.name, shlex.join(argv), log_path)
        self.process = EngineProcess(argv, self.adapter.launch_env(spec, settings.kv_cache_mb), log_path)
        base_url = f"http://{host}:{port}"
        try:
            took = await self.process.wait_ready(
                base_url, self.adapter.health_path, settings.engine_start_timeout_s
            )
        except EngineStartError:
            self._close_bridge()
            raise
        logger.info("%s is serving at %s after %.1f s", self.adapter.name, base_url, took)
        return base_url

    async def _served_model(self) -> dict[str, object]:
        """The engine's ``/v1/models`` entry for the worker's model; refuses to start on a mismatch."""
        response = await self.client.get("/v1/models")
        response.raise_for_status()
        models = response.json().get("data") or []
        for entry in models:
            if entry.get("id") == self.settings.model:
                return dict(entry)
        names = ", ".join(str(entry.get("id")) for entry in models) or "nothing"
        raise EngineStartError(
            f"the {self.adapter.name} server serves {names}, not {self.settings.model!r} (set CV_MODEL to its name)"
        )

    async def _poll_stats(self) -> None:
        while True:
            await self.frontend.refresh()
            if self.process is not None and not self.process.alive:
                logger.error("%s exited with status %s", self.adapter.name, self.process.process.returncode)
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _resync(self, msg: Msg) -> None:
        if msg.data and msg.data.decode(errors="replace") != self.worker_id:
            return
        if self.bridge is not None:
            self.bridge.resync()
            logger.info("KV resync requested: published a snapshot of the engine's blocks")

    def _close_bridge(self) -> None:
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None

    async def stop(self) -> None:
        logger.info("worker %s stopping", self.worker_id)
        self.heartbeat.draining = True
        await mark_serving(self.health, [SERVICE_NAME], serving=False)
        await self.server.stop(grace=2.0)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.frontend.close()
        await self.bus.close()
        await self.client.aclose()
        self._close_bridge()
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)
