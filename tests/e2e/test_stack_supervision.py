"""Supervision on a real stack: a SIGKILLed worker is started again, registers with the scheduler
again and serves requests; the ``make run`` launcher does the same and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc
import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc
from clairvoyant.stack import Stack, StackConfig
from tests.e2e.test_stack_openai import MODEL, records

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll ``probe`` until it returns something other than None; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (found := probe()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


@contextmanager
def supervised(stack: Stack) -> Iterator[None]:
    """``stack.supervise()`` twice a second in a thread, as ``make run`` does in its main loop.  The
    thread lives until the block ends: a child it restarts gets SIGTERM when its starter thread dies."""
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            stack.supervise()
            done.wait(0.5)

    thread = threading.Thread(target=loop, name="supervisor")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def heartbeat_since(stack: Stack, worker_id: str, since: float) -> scheduler_pb2.WorkerState | None:
    """``worker_id`` as the scheduler lists it, once it has a heartbeat sent after ``since`` (monotonic)."""
    asked = time.monotonic()
    with grpc.insecure_channel(stack.scheduler_address) as channel:
        snapshot = scheduler_pb2_grpc.SchedulerStub(channel).Snapshot(scheduler_pb2.SnapshotRequest(), timeout=5)
    for worker in snapshot.workers:
        # The scheduler's "now" is after ``asked``, so its last heartbeat came after asked - age.
        if worker.worker_id == worker_id and asked - worker.last_heartbeat_age_s > since:
            return worker
    return None


def test_a_killed_worker_is_restarted_registers_again_and_serves(stack: Stack) -> None:
    old = dict(stack.children)["worker-2"]
    with supervised(stack):
        old.send_signal(signal.SIGKILL)
        old.wait(10)
        new = wait_for("worker-2 to be started again",
                       lambda: p if (p := dict(stack.children)["worker-2"]) is not old else None)
        started = time.monotonic()  # the new process was started before this
        assert new.poll() is None
        # Registered again: a heartbeat that only the new process can have sent.
        state = wait_for("worker-2's heartbeat", lambda: heartbeat_since(stack, "worker-2", started))
        assert not state.draining and state.address.endswith(f":{stack.config.worker_grpc_base + 1}")
        assert httpx.get(f"{stack.worker_http_urls[1]}/get_server_info", timeout=5).json()["running"] == 0

        # Served again, through the gateway, on both workers.
        reply = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "after the restart"}], max_tokens=4,
            extra_body={"ignore_eos": True})
        assert reply.usage is not None and reply.usage.completion_tokens == 4

        async def burst() -> list[int]:
            api = AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="none", max_retries=0, timeout=120)
            meta = {"workflow_type_id": "restarts", "workflow_id": "wf-restarted", "agent_id": "a"}
            replies = await asyncio.gather(*[
                api.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"request {i}"}], max_tokens=8,
                    extra_body={"ignore_eos": True, "app_metadata": meta})
                for i in range(32)
            ])  # fmt: skip
            await api.close()
            return [r.usage.completion_tokens if r.usage else 0 for r in replies]

        assert asyncio.run(burst()) == [8] * 32
        served = asyncio.run(records(stack, 32, workflow_id="wf-restarted"))
        assert len(served) == 32 and {r.worker_id for r in served} == {"worker-1", "worker-2"}
        assert dict(stack.children)["worker-2"] is new  # one crash, one restart
        assert [s.restarts for s in stack.services if s.name == "worker-2"] == [1]


def _children(pid: int) -> dict[int, str]:
    """The child processes of ``pid`` (Linux /proc): pid -> command line."""
    found = {}
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError):  # exited meanwhile
            found[int(child)] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def _worker_pid(launcher: int) -> int | None:
    return next((pid for pid, cmd in _children(launcher).items() if "clairvoyant.worker" in cmd), None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_the_launcher_restarts_a_crashed_worker_and_stops_everything_on_sigterm(tmp_path: Path) -> None:
    # ``make run``'s main(), on a private stack's free ports: the default ones may be taken here.
    config = StackConfig.on_free_ports(tmp_path / "var", model=MODEL, workers=1,
                                       worker_env={"CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "256"})
    gateway_port = config.gateway_port
    fields = {**dataclasses.asdict(config), "var_dir": str(config.var_dir)}
    script = ("import json, sys; from pathlib import Path; from clairvoyant.stack import StackConfig, main; "
              "fields = json.loads(sys.argv[1]); fields['var_dir'] = Path(fields['var_dir']); "
              "sys.exit(main([], StackConfig(**fields)))")
    log_path = tmp_path / "launcher.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen([sys.executable, "-c", script, json.dumps(fields)], stderr=log)
    try:

        def logged(text: str) -> dict[str, str] | None:
            for line in log_path.read_text().splitlines():
                entry = json.loads(line) if line.startswith("{") else {}
                if entry.get("service") == "stack" and text in entry.get("msg", ""):
                    return entry
            assert launcher.poll() is None, log_path.read_text()[-3000:]
            return None

        wait_for("the launcher to be ready", lambda: logged("ready: OpenAI-compatible API"), timeout=180)
        services = _children(launcher.pid)
        assert len(services) == 6  # NATS, scheduler, profiler, cache manager, one worker, gateway
        victim = wait_for("the worker's process", lambda: _worker_pid(launcher.pid))
        os.kill(victim, signal.SIGKILL)

        crash = wait_for("the crash in the launcher's log", lambda: logged("worker-1 crashed"))
        assert crash["level"] == "warning" and "(killed by SIGKILL)" in crash["msg"]
        assert wait_for("the restart", lambda: logged("restarting worker-1 (restart 1)"))["level"] == "warning"
        assert wait_for("a new worker", lambda: p if (p := _worker_pid(launcher.pid)) not in (None, victim) else None)
        client = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="none", max_retries=0, timeout=30)

        def served() -> int | None:  # the only worker: served once it has registered again
            try:
                reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=3, extra_body={"ignore_eos": True})
            except openai.APIError:  # 503 until then
                return None
            return reply.usage.completion_tokens if reply.usage else 0

        assert wait_for("a request served after the restart", served) == 3
        everything = set(_children(launcher.pid)) | set(services)

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert not [pid for pid in everything if Path(f"/proc/{pid}").exists()]  # no orphans left
    assert "did not stop in time" not in log_path.read_text()  # every service exited on SIGTERM
