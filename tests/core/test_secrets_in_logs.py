"""No secret reaches a log: a whole stack (``python -m clairvoyant.stack``) runs with a NATS
password in its URL, NATS over mutual TLS, gRPC over mutual TLS and a created API key, serves
requests, stops, and its combined log (every service, at DEBUG) is searched for each secret."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clairvoyant.core.logs import mask_url, redact, register_secret
from clairvoyant.stack.natsserver import free_port
from tests.core.certs import TestCA
from tests.core.secure_nats import secure_nats_server

NATS_USER, NATS_PASSWORD = "cv-stack", "Nats-Pa55word-in-the-URL"
DB_PASSWORD = "Db-Pa55word-in-the-URL"


def pem_body(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None:
            pytest.fail(f"the stack exited ({process.returncode}):\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("nats://cv:s3cret@nats:4222", "nats://cv:***@nats:4222"),
        ("postgresql+psycopg://cv:p@ss:w0rd@db:5432/cv", "postgresql+psycopg://cv:***@db:5432/cv"),
        ("nats://a:one@n1:4222,nats://a:two@n2:4222", "nats://a:***@n1:4222,nats://a:***@n2:4222"),
        ("nats://s3cret-token@nats:4222", "nats://***@nats:4222"),
        ("nats://nats:4222", "nats://nats:4222"),
        ("postgresql://cv@db/cv", "postgresql://cv@db/cv"),
        ("sqlite:///var/gateway.db", "sqlite:///var/gateway.db"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert redact(f"connecting to {url} now") == f"connecting to {masked} now"


@pytest.mark.unit
def test_registered_secrets_are_masked_in_any_text() -> None:
    register_secret("SUAIBDPBAUTWCWBKIO6XHQNINK")
    assert redact("seed SUAIBDPBAUTWCWBKIO6XHQNINK in a traceback") == "seed *** in a traceback"


@pytest.mark.integration
@pytest.mark.parametrize("service", ["gateway", "profiler"])
def test_a_service_that_cannot_reach_its_database_logs_no_password(service: str, tmp_path: Path) -> None:
    dead = free_port()
    env = {
        **os.environ,
        "CV_DATABASE_URL": f"postgresql+psycopg://cv:{DB_PASSWORD}@127.0.0.1:{dead}/cv",
        "CV_NATS_URL": f"nats://{NATS_USER}:{NATS_PASSWORD}@127.0.0.1:{dead}",
        "CV_NATS_CONNECT_TIMEOUT_S": "0.5",
        "CV_LOG_LEVEL": "DEBUG",
        "CV_GATEWAY_PORT": "0", "CV_GATEWAY_GRPC_PORT": "0", "CV_PROFILER_PORT": "0", "CV_METRICS_PORT": "0",
    }
    run = subprocess.run([sys.executable, "-m", f"clairvoyant.{service}"], env=env, cwd=tmp_path,
                         capture_output=True, timeout=120)
    output = (run.stdout + run.stderr).decode(errors="replace")
    assert run.returncode == 1, output[-3000:]
    assert "connection failed" in output  # it did try, and said why
    assert DB_PASSWORD not in output and NATS_PASSWORD not in output


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_secured_stack_logs_no_secret(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    service_cert, nats_client = ca.issue("services"), ca.issue("nats-client")
    var = tmp_path / "var"
    var.mkdir()
    database_url = f"sqlite:///{var / 'gateway.db'}"
    created = subprocess.run(
        [sys.executable, "-m", "clairvoyant.gateway", "keys", "create", "--tenant", "acme",
         "--database-url", database_url],
        capture_output=True, check=True, timeout=60,
    )
    api_key = created.stdout.decode().strip()
    wrong_key = api_key[:8] + "x" * (len(api_key) - 8)
    users = [f'{{ user: "{NATS_USER}", password: "{NATS_PASSWORD}" }}']
    with secure_nats_server(tmp_path, ca, users) as nats_url:
        gateway_port = free_port()
        env = {
            **os.environ,
            "CV_NATS_URL": nats_url.replace("nats://", f"nats://{NATS_USER}:{NATS_PASSWORD}@"),
            "CV_NATS_TLS_CA": str(ca.cert), "CV_NATS_TLS_CERT": str(nats_client.cert),
            "CV_NATS_TLS_KEY": str(nats_client.key),
            "CV_GRPC_TLS": "true", "CV_GRPC_TLS_CERT": str(service_cert.cert),
            "CV_GRPC_TLS_KEY": str(service_cert.key), "CV_GRPC_TLS_CA": str(ca.cert),
            "CV_GRPC_TLS_CLIENT_AUTH": "true",
            "CV_VAR_DIR": str(var), "CV_DATABASE_URL": database_url, "CV_MODEL": "tiny-random",
            "CV_WORKERS": "1", "CV_GATEWAY_PORT": str(gateway_port), "CV_LOG_LEVEL": "DEBUG",
            "CV_TORCH_THREADS": "1", "CV_NUM_BLOCKS": "64",
        }
        log = tmp_path / "stack.log"
        with log.open("wb") as out:
            stack = subprocess.Popen([sys.executable, "-m", "clairvoyant.stack"], env=env, cwd=tmp_path,
                                     stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_line(log, "ready: OpenAI-compatible API", stack, timeout=200)
            with httpx.Client(base_url=f"http://127.0.0.1:{gateway_port}", timeout=60) as http:
                body = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                accepted = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {api_key}"})
                refused = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {wrong_key}"})
            assert accepted.status_code == 200, accepted.text
            assert accepted.json()["usage"]["completion_tokens"] >= 1
            assert refused.status_code == 401
        finally:
            stack.send_signal(signal.SIGTERM)
            try:
                stack.wait(60)
            except subprocess.TimeoutExpired:
                stack.kill()
                stack.wait()
    text = log.read_text(errors="replace")
    assert f"nats://{NATS_USER}:***@127.0.0.1" in text  # the URL was logged, masked
    assert "connected to NATS" in text
    secrets = {
        "the NATS password": [NATS_PASSWORD],
        "the API key": [api_key, api_key[8:]],
        "the refused API key": [wrong_key],
        "the gRPC private key": pem_body(service_cert.key),
        "the NATS client private key": pem_body(nats_client.key),
    }
    leaked = [what for what, values in secrets.items() if any(value in text for value in values)]
    assert not leaked, f"{leaked} in the stack's log"
