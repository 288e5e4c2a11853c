"""A nats-server with JetStream that requires TLS (client certificates from a test CA) and
credentials, started from a configuration file written by the test."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from clairvoyant.stack.natsserver import find_nats_server, free_port, port_open
from tests.core.certs import TestCA


@contextlib.contextmanager
def secure_nats_server(directory: Path, ca: TestCA, users: list[str]) -> Iterator[str]:
    """Yields ``nats://127.0.0.1:PORT``.  ``users``: entries of the ``authorization.users`` list,
    e.g. ``'{ user: "cv", password: "pw" }'`` or ``'{ nkey: "U..." }'``."""
    server = ca.issue("nats")
    port = free_port()
    config = directory / "nats.conf"
    entries = "\n    ".join(users)
    config.write_text(f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{directory / 'jetstream'}" }}
tls {{
  cert_file: "{server.cert}"
  key_file: "{server.key}"
  ca_file: "{ca.cert}"
  verify: true
  timeout: 2
}}
authorization {{
  users: [
    {entries}
  ]
}}
""")
    log = directory / "nats.log"
    with log.open("wb") as out:
        process = subprocess.Popen([find_nats_server(), "-c", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not port_open("127.0.0.1", port):
            if process.poll() is not None:
                raise RuntimeError(f"nats-server exited: {log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError("nats-server did not start")
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
