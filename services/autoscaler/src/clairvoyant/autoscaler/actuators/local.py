"""Replicas as worker processes on this machine, started the way ``make run`` starts its workers."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from clairvoyant.autoscaler.actuators.base import ACTUATORS, ActuatorError, model_slug
from clairvoyant.core.processes import PARENT_PID_ENV

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class LocalReplica:
    worker_id: str
    model: str
    grpc_port: int
    http_port: int
    log_path: Path  # the worker's stdout and stderr
    process: asyncio.subprocess.Process


@ACTUATORS.register("local")
class LocalActuator:
    """Worker processes on this machine, each on free gRPC and HTTP ports, logging to
    ``<var_dir>/logs/<worker id>.log``; worker ids are ``<prefix>-<model slug>-<n>``.

    A worker's environment is this process's (CV_ADVERTISE_HOST aside), then ``environment`` (CV_NATS_URL, CV_RUNNER,
    CV_GPU, ...), then ``model_environment[model]``, then what the actuator sets itself: CV_WORKER_ID,
    CV_MODEL, CV_WORKER_GRPC_PORT, CV_WORKER_HTTP_PORT.  ``release`` sends SIGTERM (the worker
    stops serving and leaves the bus) and SIGKILL after ``stop_timeout_s``.
    """

    name = "local"

    def __init__(
        self,
        *,
        environment: Mapping[str, str] | None = None,
        model_environment: Mapping[str, Mapping[str, str]] | None = None,
        var_dir: Path = Path("var/autoscaler"),
        prefix: str = "local",
        host: str = "127.0.0.1",
        stop_timeout_s: float = 10.0,
    ) -> None:
        # Installed beside the worker for local runs (the `local` extra); the autoscaler's image
        # has neither, so a misconfigured actuator fails here, at start-up.
        from clairvoyant.stack.natsserver import free_ports

        self._free_ports = free_ports
        self.environment = dict(environment or {})
        self.model_environment = {model: dict(env) for model, env in (model_environment or {}).items()}
        self.log_dir = var_dir / "logs"
        self.prefix = prefix
        self.host = host
        self.stop_timeout_s = stop_timeout_s
        self._replicas: dict[str, LocalReplica] = {}
        self._counters: defaultdict[str, itertools.count[int]] = defaultdict(lambda: itertools.count(1))

    @property
    def replicas(self) -> dict[str, LocalReplica]:
        """Worker id -> the replica as started, exited ones included until released."""
        return dict(self._replicas)

    async def provision(self, model: str) -> str:
        worker_id = f"{self.prefix}-{model_slug(model)}-{next(self._counters[model])}"
        try:
            grpc_port, http_port = self._free_ports(1, 1, host=self.host)
        except OSError as exc:
            raise ActuatorError(f"no free ports for worker {worker_id}: {exc}") from exc
        inherited = {k: v for k, v in os.environ.items() if k != "CV_ADVERTISE_HOST"}  # this host's own
        env = {
            **inherited,
            **self.environment,
            **self.model_environment.get(model, {}),
            "CV_WORKER_ID": worker_id,
            "CV_MODEL": model,
            "CV_HOST": self.environment.get("CV_HOST", self.host),
            "CV_WORKER_GRPC_PORT": str(grpc_port),
            "CV_WORKER_HTTP_PORT": str(http_port),
            PARENT_PID_ENV: str(os.getpid()),  # the worker stops when this process dies
        }
        log_path = self.log_dir / f"{worker_id}.log"
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with log_path.open("ab") as log:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "clairvoyant.worker",
                    env=env, stdout=log, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                    # No preexec_fn and no fd closing, so Python uses posix_spawn: gRPC's fork
                    # handlers never run in the child (a forked child once hung in them under load).
                    close_fds=False,
                )
        except OSError as exc:
            raise ActuatorError(f"cannot start worker {worker_id} ({model}): {exc}") from exc
        self._replicas[worker_id] = LocalReplica(worker_id, model, grpc_port, http_port, log_path, process)
        logger.info("started worker %s (%s), pid %d, grpc :%d, log %s",
                    worker_id, model, process.pid, grpc_port, log_path)
        return worker_id

    async def release(self, replica_id: str, model: str) -> None:
        replica = self._replicas.get(replica_id)
        if replica is None:
            return
        await self._stop(replica)
        self._replicas.pop(replica_id, None)

    async def running(self) -> dict[str, str]:
        return {wid: r.model for wid, r in self._replicas.items() if r.process.returncode is None}

    async def close(self) -> None:
        replicas = list(self._replicas.values())
        for replica in replicas:  # all get SIGTERM at once, then each is waited for
            _signal(replica.process, signal.SIGTERM)
        await asyncio.gather(*(self.release(r.worker_id, r.model) for r in replicas))

    async def _stop(self, replica: LocalReplica) -> None:
        process = replica.process
        _signal(process, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.stop_timeout_s)
        except TimeoutError:
            logger.warning("worker %s did not stop within %.0f s; killing it", replica.worker_id, self.stop_timeout_s)
            _signal(process, signal.SIGKILL)
            await process.wait()
        logger.info("worker %s stopped (exit %s)", replica.worker_id, process.returncode)


def _signal(process: asyncio.subprocess.Process, signum: signal.Signals) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # exited; its exit status is not collected yet
            process.send_signal(signum)
