"""A fleet of workers (emulated, of several models, or fronting vLLM servers), with our gateway and
a scheduler in front.

    NATS ── worker × N (each its own model, gRPC + OpenAI HTTP) ── scheduler(preset) ── gateway

``clairvoyant.stack.Stack`` serves one model; ``live-compare`` needs the simulated cluster of a
multi-model workload (coding_assistant: qwen2.5-14b and qwen2.5-7b) and a scheduler that can be
restarted with another preset while the workers and the gateway keep running, which is how an
operator switches presets.  No profiler: the compared arms read no annotations live (a profile
leaves shadow only after 30 closed workflows), and on a 2-core machine it would cost CPU time.
Every process is a child that gets SIGTERM if this one dies; logs go to ``<var_dir>/<name>.log``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc
import httpx

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.core.processes import die_with_parent
from clairvoyant.stack.natsserver import NatsServer, free_port


@dataclass(frozen=True)
class WorkerSpec:
    worker_id: str
    model: str
    env: Mapping[str, str]  # settings (CV_*, and the engine's own) beyond ports, id, model and NATS


class Fleet:
    """``start(policy)``, then ``restart_scheduler(other)`` between runs, then ``stop()``."""

    def __init__(self, var_dir: Path, workers: Sequence[WorkerSpec]) -> None:
        self.var_dir = var_dir
        self.specs = list(workers)
        self.nats: NatsServer | None = None
        self.scheduler_port = free_port()
        self.scheduler_address = f"127.0.0.1:{self.scheduler_port}"
        self.gateway_port = free_port()
        self.gateway_url = f"http://127.0.0.1:{self.gateway_port}"
        self.worker_http: dict[str, str] = {}  # worker id -> its OpenAI-compatible HTTP base URL
        self.policy = ""
        self._children: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = {}

    def http_urls(self, model: str) -> list[str]:
        return [self.worker_http[s.worker_id] for s in self.specs if s.model == model]

    @property
    def models(self) -> list[str]:
        return sorted({s.model for s in self.specs})

    def start(self, policy: str, timeout_s: float = 300.0) -> Fleet:
        self.var_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.nats = NatsServer(self.var_dir / "nats", port=free_port()).start()
            for spec in self.specs:
                http_port = free_port()
                self.worker_http[spec.worker_id] = f"http://127.0.0.1:{http_port}"
                env = {**spec.env, "CV_WORKER_ID": spec.worker_id, "CV_MODEL": spec.model,
                       "CV_WORKER_GRPC_PORT": str(free_port()), "CV_WORKER_HTTP_PORT": str(http_port)}  # fmt: skip
                self._spawn(spec.worker_id, "clairvoyant.worker", env)
            self._start_scheduler(policy)
            self._spawn("gateway", "clairvoyant.gateway", {
                "CV_GATEWAY_PORT": str(self.gateway_port), "CV_GATEWAY_GRPC_PORT": str(free_port()),
                "CV_SCHEDULER_ADDRESS": self.scheduler_address, "CV_PROFILER_ADDRESS": "",
                "CV_DATABASE_URL": f"sqlite:///{self.var_dir / 'gateway.db'}",
            })  # fmt: skip
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def restart_scheduler(self, policy: str, timeout_s: float = 60.0) -> None:
        """A new scheduler process with ``policy`` on the same port; workers and gateway stay."""
        self._terminate("scheduler")
        self._start_scheduler(policy)
        self._wait_ready(timeout_s)

    def stop(self) -> None:
        for name in ["gateway", "scheduler", *(s.worker_id for s in self.specs)]:
            self._terminate(name)
        if self.nats is not None:
            self.nats.stop()
            self.nats = None

    # ---- internals ------------------------------------------------------------------------------

    def _start_scheduler(self, policy: str) -> None:
        self.policy = policy
        self._spawn("scheduler", "clairvoyant.scheduler", {
            "CV_SCHEDULER_PORT": str(self.scheduler_port), "CV_METRICS_PORT": "0", "CV_POLICY": policy,
        })  # fmt: skip

    def _spawn(self, name: str, module: str, env: Mapping[str, str]) -> None:
        assert self.nats is not None
        full = {**os.environ, "CV_LOG_LEVEL": "WARNING", "CV_HOST": "127.0.0.1", "CV_NATS_URL": self.nats.url, **env}
        full.pop("CV_ADVERTISE_HOST", None)
        log = (self.var_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", module], env=full, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        )
        self._children[name] = (process, log)

    def _terminate(self, name: str, timeout_s: float = 10.0) -> None:
        child = self._children.pop(name, None)
        if child is None:
            return
        process, log = child
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()

    def _dead(self) -> str | None:
        for name, (process, _) in self._children.items():
            if process.poll() is not None:
                return f"{name} exited with {process.returncode}; see {self.var_dir / (name + '.log')}"
        return None

    def _wait_ready(self, timeout_s: float) -> None:
        """Until the scheduler runs ``self.policy`` with every worker and the gateway lists every model."""
        deadline = time.monotonic() + timeout_s
        state = "nothing yet"
        with grpc.insecure_channel(self.scheduler_address) as chan:
            stub = scheduler_pb2_grpc.SchedulerStub(chan)
            while True:
                dead = self._dead()
                if dead:
                    raise RuntimeError(dead)
                try:
                    snapshot = stub.Snapshot(scheduler_pb2.SnapshotRequest(), timeout=1.0)
                    state = f"{len(snapshot.workers)}/{len(self.specs)} workers, policy {snapshot.policy}"
                    if snapshot.policy == self.policy and len(snapshot.workers) >= len(self.specs):
                        page = httpx.get(f"{self.gateway_url}/v1/models", timeout=2.0)
                        if page.status_code == 200 and {m["id"] for m in page.json()["data"]} >= set(self.models):
                            return
                        state += f", gateway answered {page.status_code}"
                except (grpc.RpcError, httpx.HTTPError) as exc:
                    state = f"{state} ({type(exc).__name__})"
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fleet not ready after {timeout_s:.0f} s: {state}")
                time.sleep(0.5)
