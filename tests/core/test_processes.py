"""Services started by the stack launcher stop when it dies, without a ``preexec_fn`` (Python code
between fork and exec aborts the child of a process with gRPC threads): each calls
``follow_parent``, told its parent's pid in ``CV_PARENT_PID``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")]

CHILD = "from clairvoyant.core.processes import follow_parent; import time; follow_parent(); time.sleep(60)"
PARENT = textwrap.dedent(
    f"""
    import os, subprocess, sys, time
    env = {{**os.environ, "CV_PARENT_PID": str(os.getpid())}}
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env=env)
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_service_exits_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has imported and asked for its signal
    assert alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_a_service_whose_parent_is_already_gone_does_not_start() -> None:
    env = {**os.environ, "CV_PARENT_PID": "1"}  # not its parent
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "parent process 1 is gone" in done.stderr
