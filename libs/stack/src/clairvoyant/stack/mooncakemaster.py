"""Run a local ``mooncake_master`` with its built-in HTTP metadata server (the binary from the
worker's ``mooncake`` extra, ``mooncake-transfer-engine-non-cuda``).

Used by ``make run`` when the workers' ``CV_L3_URL`` names a Mooncake master on this machine, and
by the L3 tests.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from clairvoyant.core.processes import die_with_parent
from clairvoyant.stack.natsserver import free_ports, port_open

INSTALL_HINT = ("pip install 'clairvoyant-worker[mooncake]' and Debian's libibverbs1 "
                "(make install does both)")


def find_mooncake_master() -> str:
    """The ``mooncake_master`` executable: the one inside the installed ``mooncake`` package
    first (the console script of that name only execs it), then PATH."""
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            inside = Path(folder) / "mooncake_master"
            if inside.is_file():
                return str(inside)
    beside = Path(sys.executable).parent / "mooncake_master"
    if beside.exists():
        return str(beside)
    found = shutil.which("mooncake_master")
    if found:
        return found
    raise FileNotFoundError(f"mooncake_master not found: {INSTALL_HINT}")


class MooncakeMaster:
    """A ``mooncake_master`` child process: RPC on ``rpc_port``, metadata over HTTP on
    ``metadata_port``, its own metrics on ``metrics_port`` (free ports where not given).  Its
    output goes to ``log_path`` (None: discarded)."""

    def __init__(self, host: str = "127.0.0.1", rpc_port: int | None = None, metadata_port: int | None = None,
                 metrics_port: int | None = None, log_path: Path | None = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        free = free_ports(1, 1, 1, host=host)
        self.host = host
        self.rpc_port = rpc_port or free[0]
        self.metadata_port = metadata_port or free[1]
        self.metrics_port = metrics_port or free[2]
        self.log_path = log_path
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    @property
    def l3_url(self) -> str:
        """The workers' ``CV_L3_URL`` for this master (Mooncake's defaults for the rest)."""
        return f"mooncake://{self.address}?metadata={self.metadata_url}"

    def start(self, timeout: float = 15.0) -> MooncakeMaster:
        """Start it and wait until it answers.  In a session of its own, so a terminal's Ctrl-C
        reaches only its parent, which stops it after the clients (a Mooncake client that loses
        its master takes seconds to close); it still dies with its parent."""
        args = [find_mooncake_master(), f"--rpc_address={self.host}", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", f"--http_metadata_server_host={self.host}",
                f"--http_metadata_server_port={self.metadata_port}", f"--metrics_port={self.metrics_port}",
                *self.extra_args]
        if self.log_path is None:
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True, preexec_fn=die_with_parent)
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + timeout
        while not (port_open(self.host, self.rpc_port) and self._metadata_answers()):
            if self.process.poll() is not None:
                where = f"; see {self.log_path}" if self.log_path else ""
                raise RuntimeError(f"mooncake_master exited with code {self.process.returncode}{where}: "
                                   f"{' '.join(args)}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"mooncake_master did not answer on {self.address} within {timeout} s")
            time.sleep(0.05)
        return self

    def _metadata_answers(self) -> bool:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with direct.open(self.metadata_url, timeout=0.5):
                return True
        except urllib.error.HTTPError:  # it answers; a GET without a key is a 4xx
            return True
        except OSError:
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
