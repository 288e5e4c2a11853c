"""Child processes that do not outlive their parent (the launcher's services, the autoscaler's
local workers)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# Looked up once here: the child runs die_with_parent between fork and exec, where importing or
# loading a library could deadlock on a lock another thread of the parent held at the fork.
_PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1

PARENT_PID_ENV = "CV_PARENT_PID"


def die_with_parent() -> None:
    """A ``preexec_fn``.  Linux: the child gets SIGTERM if its parent dies, even by SIGKILL (no
    orphans).  The signal follows the *thread* that started the child: start children from a
    thread that outlives them (the main thread, or the event loop's)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def follow_parent() -> None:
    """For a child started without a ``preexec_fn`` (``posix_spawn``, which runs no fork handlers:
    a parent with gRPC threads cannot deadlock the child between fork and exec): when
    ``CV_PARENT_PID`` names the parent, ask for SIGTERM when it dies, and exit at once if it
    already has."""
    expected = os.environ.get(PARENT_PID_ENV)
    if not expected:
        return
    die_with_parent()
    if os.getppid() != int(expected):
        sys.exit(f"parent process {expected} is gone; not starting")
