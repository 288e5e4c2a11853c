"""gRPC between services over TLS and mutual TLS, with certificates made by the test.

A server bound with TLS answers TLS clients that trust its CA and refuses plaintext ones; under
client auth it also refuses clients without a certificate signed by that CA.  The services read
all of it from ``CV_GRPC_TLS*`` settings, and ``channel(address)`` follows the process's setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import ValidationError

from clairvoyant.contracts.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2_grpc
from clairvoyant.core.bus import EventBus, NatsSecurity, configure_nats
from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.grpcutil import (
    GrpcTls,
    add_health,
    bind,
    channel,
    configure_tls,
    mark_serving,
    new_server,
    process_tls,
    sync_channel,
)
from clairvoyant.gateway.app import GatewayApp
from clairvoyant.gateway.config import GatewaySettings
from clairvoyant.scheduler.app import SchedulerApp
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.stack.natsserver import free_port
from tests.core.certs import CertFiles, TestCA
from tests.gateway.fakes import MODEL, FakeScheduler, FakeWorker, WorkerEntry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(autouse=True)
def plaintext_afterwards() -> Iterator[None]:
    """Services set the process's TLS at start; later tests in this process expect plaintext."""
    yield
    configure_tls(GrpcTls())
    configure_nats(NatsSecurity())


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "ca")


@pytest.fixture
def other_ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path / "other-ca", name="someone else's CA")


def server_tls(ca: TestCA, files: CertFiles, *, client_auth: bool = False) -> GrpcTls:
    return GrpcTls(
        enabled=True,
        certificate_chain=files.cert.read_bytes(),
        private_key=files.key.read_bytes(),
        root_certificates=ca.cert.read_bytes(),
        client_auth=client_auth,
    )


def client_tls(ca: TestCA, files: CertFiles | None = None, *, server_name: str = "") -> GrpcTls:
    return GrpcTls(
        enabled=True,
        root_certificates=ca.cert.read_bytes(),
        client_certificate_chain=files.cert.read_bytes() if files else None,
        client_private_key=files.key.read_bytes() if files else None,
        server_name=server_name,
    )


def tls_env(ca: TestCA, files: CertFiles, *, client_auth: bool = False) -> dict[str, Any]:
    """The ``CV_GRPC_TLS*`` settings of a service presenting ``files``, as keyword arguments."""
    return {
        "grpc_tls": True,
        "grpc_tls_cert": str(files.cert),
        "grpc_tls_key": str(files.key),
        "grpc_tls_ca": str(ca.cert),
        "grpc_tls_client_auth": client_auth,
    }


@pytest.fixture
async def health_server() -> AsyncIterator[Any]:
    """``await start(tls)`` -> the address of a started server answering grpc.health.v1."""
    servers: list[grpc.aio.Server] = []

    async def start(tls: GrpcTls) -> str:
        server = new_server()
        servicer = add_health(server, ["test.Service"])
        port = bind(server, "127.0.0.1:0", tls)
        await server.start()
        await mark_serving(servicer, ["test.Service"])
        servers.append(server)
        return f"localhost:{port}"

    yield start
    for server in servers:
        await server.stop(None)


async def health(address: str, tls: GrpcTls) -> grpc.StatusCode | int:
    """SERVING when the call went through, else the status code it failed with."""
    async with channel(address, tls) as chan:
        try:
            reply = await health_pb2_grpc.HealthStub(chan).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return reply.status


async def test_tls_server_answers_tls_clients_and_refuses_plaintext(ca: TestCA, health_server: Any) -> None:
    address = await health_server(server_tls(ca, ca.issue("scheduler")))
    assert await health(address, client_tls(ca)) == SERVING
    assert await health(address, GrpcTls()) == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_servers_ca_is_refused(
    ca: TestCA, other_ca: TestCA, health_server: Any
) -> None:
    address = await health_server(server_tls(ca, ca.issue("scheduler")))
    assert await health(address, client_tls(other_ca)) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_admits_only_clients_with_a_certificate_from_the_ca(
    ca: TestCA, other_ca: TestCA, health_server: Any
) -> None:
    address = await health_server(server_tls(ca, ca.issue("worker"), client_auth=True))
    assert await health(address, client_tls(ca)) == grpc.StatusCode.UNAVAILABLE  # no certificate
    assert await health(address, client_tls(ca, other_ca.issue("intruder"))) == grpc.StatusCode.UNAVAILABLE
    assert await health(address, client_tls(ca, ca.issue("gateway"))) == SERVING
    assert await health(address, GrpcTls()) == grpc.StatusCode.UNAVAILABLE


async def test_a_service_certificate_doubles_as_its_client_certificate(ca: TestCA, health_server: Any) -> None:
    """Without a separate client certificate, a service shows the one it serves with."""
    address = await health_server(server_tls(ca, ca.issue("worker"), client_auth=True))
    own = server_tls(ca, ca.issue("scheduler"))
    assert own.client_certificate_chain is None
    assert await health(address, own) == SERVING


async def test_server_name_override_verifies_a_certificate_issued_for_another_name(
    ca: TestCA, health_server: Any
) -> None:
    """Dialled as localhost, the server presents a certificate for scheduler.internal only."""
    address = await health_server(server_tls(ca, ca.issue("scheduler", dns_names=("scheduler.internal",),
                                                          ip=False)))
    assert await health(address, client_tls(ca)) == grpc.StatusCode.UNAVAILABLE
    assert await health(address, client_tls(ca, server_name="scheduler.internal")) == SERVING


def test_settings_turn_tls_on_and_read_the_files(ca: TestCA) -> None:
    files, client = ca.issue("scheduler"), ca.issue("scheduler-client")
    assert not GrpcTls.from_settings(ServiceSettings(**{})).enabled  # plaintext by default
    tls = GrpcTls.from_settings(ServiceSettings(
        **tls_env(ca, files, client_auth=True),
        grpc_tls_client_cert=str(client.cert),
        grpc_tls_client_key=str(client.key),
        grpc_tls_server_name="scheduler.internal",
    ))
    assert tls == GrpcTls(
        enabled=True,
        certificate_chain=files.cert.read_bytes(),
        private_key=files.key.read_bytes(),
        root_certificates=ca.cert.read_bytes(),
        client_auth=True,
        client_certificate_chain=client.cert.read_bytes(),
        client_private_key=client.key.read_bytes(),
        server_name="scheduler.internal",
    )
    assert files.key.read_text().splitlines()[1] not in repr(tls)  # keys stay out of logs and tracebacks


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        ({"grpc_tls": True}, "CV_GRPC_TLS needs CV_GRPC_TLS_CERT"),
        ({"grpc_tls_cert": "server.pem"}, "must be set together"),
        ({"grpc_tls_client_cert": "client.pem"}, "must be set together"),
        ({"grpc_tls": True, "grpc_tls_cert": "s.pem", "grpc_tls_key": "k.pem", "grpc_tls_client_auth": True},
         "CV_GRPC_TLS_CLIENT_AUTH needs"),
    ],
)
def test_half_configured_tls_is_a_start_up_error(settings: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        ServiceSettings(**settings)


def test_a_missing_certificate_file_stops_the_start(tmp_path: Path) -> None:
    settings = ServiceSettings(grpc_tls=True, grpc_tls_cert=str(tmp_path / "nope.pem"), grpc_tls_key="k.pem")
    with pytest.raises(FileNotFoundError, match="nope.pem"):
        GrpcTls.from_settings(settings)


async def test_scheduler_serves_mutual_tls_and_sets_the_process_default(ca: TestCA) -> None:
    settings = SchedulerSettings(
        **tls_env(ca, ca.issue("scheduler"), client_auth=True),
        scheduler_port=0, metrics_port=0, nats_url=f"nats://127.0.0.1:{free_port()}", nats_connect_timeout_s=0.5,
    )
    app = SchedulerApp(settings)
    await app.start()
    try:
        assert process_tls().enabled  # what channel(address) now uses, e.g. for KV moves
        async with channel(app.address) as chan:  # the scheduler's own certificate as client's
            snapshot = await scheduler_pb2_grpc.SchedulerStub(chan).Snapshot(scheduler_pb2.SnapshotRequest(), timeout=5)
        assert list(snapshot.workers) == []

        def probe() -> int:  # the launcher's readiness probe, blocking: off the server's event loop
            with sync_channel(app.address) as chan:
                request = scheduler_pb2.SnapshotRequest()
                return len(scheduler_pb2_grpc.SchedulerStub(chan).Snapshot(request, timeout=5).workers)

        assert await asyncio.to_thread(probe) == 0
        assert await health(app.address, client_tls(ca)) == grpc.StatusCode.UNAVAILABLE  # no client certificate
        assert await health(app.address, GrpcTls()) == grpc.StatusCode.UNAVAILABLE
    finally:
        await app.stop()


async def test_gateway_serves_and_dials_over_mutual_tls(ca: TestCA, tmp_path: Path) -> None:
    """A completion through a gateway whose scheduler and worker accept only mTLS clients; the
    gateway's own gRPC edge refuses plaintext."""
    backend_tls = server_tls(ca, ca.issue("backend"), client_auth=True)
    scheduler, worker = FakeScheduler(), FakeWorker()
    servers = []
    for servicer, add in ((scheduler, scheduler_pb2_grpc.add_SchedulerServicer_to_server),
                          (worker, worker_pb2_grpc.add_WorkerServicer_to_server)):
        server = grpc.aio.server()
        add(servicer, server)  # type: ignore[operator]
        port = bind(server, "127.0.0.1:0", backend_tls)
        await server.start()
        servers.append((server, f"127.0.0.1:{port}"))
    scheduler.workers.append(WorkerEntry(worker.worker_id, servers[1][1]))
    settings = GatewaySettings(
        **tls_env(ca, ca.issue("gateway")),
        host="127.0.0.1", gateway_port=0, gateway_grpc_port=0, scheduler_address=servers[0][1],
        database_url=f"sqlite:///{tmp_path / 'gateway.db'}", model_cache_s=0.0, shutdown_grace_s=1.0,
    )
    bus = EventBus(f"nats://127.0.0.1:{free_port()}", "gateway-test", connect_timeout_s=0.5)  # records wait
    gateway = GatewayApp(settings, bus)
    await gateway.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.http_port}", timeout=10) as http:
            reply = await http.post("/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
            })
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == "Hello, world!"
        assert len(scheduler.schedule_calls) == 1 and len(worker.calls) == 1
        edge = f"localhost:{gateway.grpc_port}"
        assert await health(edge, client_tls(ca)) == SERVING
        assert await health(edge, GrpcTls()) == grpc.StatusCode.UNAVAILABLE
    finally:
        await gateway.stop()
        await bus.close()
        for server, _ in servers:
            await server.stop(None)


async def test_the_container_health_probe_dials_with_the_services_own_tls(
    ca: TestCA, health_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gRPC images' HEALTHCHECK (``grpc_health_serving``) reads CV_GRPC_TLS* as the service does."""
    import asyncio

    from clairvoyant.core.healthcheck import grpc_health_serving

    files = ca.issue("services")
    address = await health_server(server_tls(ca, files, client_auth=True))
    for name, value in tls_env(ca, files, client_auth=True).items():
        monkeypatch.setenv(f"CV_{name.upper()}", str(value).lower() if isinstance(value, bool) else value)
    assert await asyncio.to_thread(grpc_health_serving, address)
    monkeypatch.setenv("CV_GRPC_TLS", "false")  # a plaintext probe of a TLS server: unhealthy, no exception
    monkeypatch.setenv("CV_GRPC_TLS_CLIENT_AUTH", "false")
    assert not await asyncio.to_thread(grpc_health_serving, address)
    plain = await health_server(GrpcTls())
    assert await asyncio.to_thread(grpc_health_serving, plain)
