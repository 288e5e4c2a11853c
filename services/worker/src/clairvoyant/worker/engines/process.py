"""The peer engine's server process: started by the worker, watched, and stopped with it.

The engine runs in its own process group (vLLM starts an engine-core and a model-runner process
of its own), so ``stop`` signals the whole group: nothing outlives the worker.  Its output goes to
a log file; a start that fails says why with the log's last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx

from clairvoyant.core.processes import die_with_parent

logger = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The engine exited, or did not answer its health check in time."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EngineProcess:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env},
            start_new_session=True,  # its own process group: stop() reaches the engine's children
            preexec_fn=die_with_parent,  # noqa: PLW1509 - started before the worker's gRPC threads
        )

    async def wait_ready(self, base_url: str, health_path: str, timeout_s: float) -> float:
        """Poll ``health_path`` until it answers 200; returns the seconds it took.  Raises
        EngineStartError (with the log's tail) if the process exits or the time runs out."""
        start = time.monotonic()
        next_note = start + 30.0
        async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise EngineStartError(
                        f"the engine exited with status {self.process.returncode} while starting; "
                        f"{self.log_path} ends:\n{log_tail(self.log_path)}"
                    )
                try:
                    if (await client.get(health_path)).status_code == 200:
                        return time.monotonic() - start
                except httpx.HTTPError:
                    pass
                now = time.monotonic()
                if now - start > timeout_s:
                    self.stop()
                    raise EngineStartError(
                        f"the engine did not answer {base_url}{health_path} within {timeout_s:.0f} s; "
                        f"{self.log_path} ends:\n{log_tail(self.log_path)}"
                    )
                if now >= next_note:  # a long start (a model load, a compile) shows progress
                    logger.info("engine still starting after %.0f s (log: %s)", now - start, self.log_path)
                    next_note = now + 30.0
                await asyncio.sleep(0.5)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the engine's process group, SIGKILL after ``grace_s``."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("engine did not stop within %.0f s: killing it", grace_s)
                self._signal(signal.SIGKILL)
                self.process.wait()
        self._signal(signal.SIGKILL)  # children left behind by a parent that exited first
        self._log.close()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)
