"""The launcher's supervision on small real processes: backoff, what counts as a crash, planned restarts.

Times are passed in (``supervise(now)``), so the backoff schedule is exact; the processes are real
(``sh -c 'exit N'``), and each is waited for before the pass that should notice it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path

import pytest

from clairvoyant.stack import RestartPolicy, Service, Stack, StackConfig, describe_exit

pytestmark = pytest.mark.unit


def test_the_delay_doubles_up_to_the_cap_and_resets_after_a_long_run() -> None:
    policy = RestartPolicy(first_delay_s=1.0, max_delay_s=30.0, reset_after_s=30.0)
    delays: list[float] = []
    previous = None
    for _ in range(8):
        previous = policy.next_delay(previous, uptime_s=0.5)
        delays.append(previous)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert policy.next_delay(30.0, uptime_s=29.9) == 30.0
    assert policy.next_delay(30.0, uptime_s=30.0) == 1.0  # it stayed up: recovered


@pytest.mark.parametrize(("returncode", "text"), [(3, "exit code 3"), (-9, "killed by SIGKILL"),
                                                  (-15, "killed by SIGTERM"), (1, "exit code 1")])
def test_exits_are_described_by_code_or_signal(returncode: int, text: str) -> None:
    assert describe_exit(returncode) == text


class Launches:
    """A service's launcher that runs ``sh -c 'exit CODE'`` and remembers every process it started."""

    def __init__(self, code: int = 3) -> None:
        self.code = code
        self.processes: list[subprocess.Popen[bytes]] = []

    def __call__(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(["sh", "-c", f"exit {self.code}"])
        self.processes.append(process)
        return process

    def wait_last(self) -> None:
        self.processes[-1].wait(10)


def stack_with(tmp_path: Path, name: str, launch: Launches, policy: RestartPolicy | None = None) -> Stack:
    """A Stack supervising one service started at time 0, and nothing else."""
    stack = Stack(StackConfig(var_dir=tmp_path), restart_policy=policy)
    service = Service(name, launch)
    service.start(now=0.0)
    stack.services.append(service)
    return stack


def test_a_service_that_crashes_at_start_is_retried_with_backoff_not_hot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    launch = Launches(code=3)
    stack = stack_with(tmp_path, "worker-1", launch, RestartPolicy(first_delay_s=1.0, max_delay_s=8.0))
    caplog.set_level(logging.WARNING, logger="clairvoyant.stack")
    starts = [0.0]
    for tick in range(1, 121):  # 60 s of passes, two a second, as ``main`` makes them
        now = tick * 0.5
        launch.wait_last()
        before = len(launch.processes)
        stack.supervise(now)
        if len(launch.processes) > before:
            starts.append(now)
    # Each crash is noticed on the next pass; waits of 1, 2, 4 and 8 s (the cap) follow.
    assert starts == [0.0, 1.5, 4.0, 8.5, 17.0, 25.5, 34.0, 42.5, 51.0, 59.5]
    crashes = [r.getMessage() for r in caplog.records if "crashed" in r.getMessage()]
    assert crashes[0] == "worker-1 crashed (exit code 3) after 0.5 s up; restarting it in 1 s"
    assert crashes[4] == "worker-1 crashed (exit code 3) after 0.5 s up; restarting it in 8 s"
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert stack.services[0].restarts == len(starts) - 1


def test_a_clean_exit_is_not_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    launch = Launches(code=0)
    stack = stack_with(tmp_path, "profiler", launch)
    caplog.set_level(logging.WARNING, logger="clairvoyant.stack")
    launch.wait_last()
    for tick in range(1, 200):
        stack.supervise(tick * 0.5)
    assert len(launch.processes) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "profiler exited cleanly after 0.5 s; not restarting it (only crashes are)"]


def test_a_kill_after_a_long_run_restarts_after_the_first_delay_and_stop_ends_the_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sleeper: list[subprocess.Popen[bytes]] = []

    def launch() -> subprocess.Popen[bytes]:
        sleeper.append(subprocess.Popen(["sleep", "60"]))
        return sleeper[-1]

    stack = Stack(StackConfig(var_dir=tmp_path))
    service = Service("gateway", launch)
    service.start(now=0.0)
    service.restart_delay_s = 30.0  # it crashed before, long ago
    stack.services.append(service)
    caplog.set_level(logging.WARNING, logger="clairvoyant.stack")

    stack.supervise(100.0)
    assert len(sleeper) == 1  # alive: nothing to do
    sleeper[0].send_signal(signal.SIGKILL)
    sleeper[0].wait(10)
    stack.supervise(100.5)
    assert service.restart_at == 101.5  # up 100 s: recovered, so the first delay again
    stack.supervise(101.0)
    assert len(sleeper) == 1
    stack.supervise(101.5)
    assert len(sleeper) == 2 and sleeper[1].poll() is None
    assert [r.getMessage() for r in caplog.records] == [
        "gateway crashed (killed by SIGKILL) after 100.5 s up; restarting it in 1 s",
        "restarting gateway (restart 1)",
    ]
    stack.stop(timeout=5)
    assert sleeper[1].returncode == -signal.SIGTERM


def test_a_planned_restart_replaces_the_process_and_keeps_the_backoff(tmp_path: Path) -> None:
    launched: list[subprocess.Popen[bytes]] = []

    def launch() -> subprocess.Popen[bytes]:
        launched.append(subprocess.Popen(["sleep", "60"]))
        return launched[-1]

    stack = Stack(StackConfig(var_dir=tmp_path))
    service = Service("scheduler", launch)
    service.start(now=0.0)
    service.restart_delay_s = 4.0
    stack.services.append(service)
    stack.restart("scheduler", timeout=5)
    assert launched[0].returncode == -signal.SIGTERM
    assert launched[1].poll() is None and service.process is launched[1]
    assert service.restart_delay_s == 4.0 and service.restarts == 0
    stack.stop(timeout=5)
    assert launched[1].returncode == -signal.SIGTERM
