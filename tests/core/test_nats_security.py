"""The event bus against a real nats-server that requires TLS with client certificates and
credentials: a user and password, or an nkeys seed.  Wrong credentials are refused with an error
that says so, and the secrets stay out of the log."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import nkeys
import pytest
from nats.aio.msg import Msg

from clairvoyant.core import security
from clairvoyant.core.bus import (
    COMPLETIONS_STREAM,
    COMPLETIONS_SUBJECT,
    EventBus,
    NatsSecurity,
    configure_nats,
)
from clairvoyant.core.config import ServiceSettings
from clairvoyant.core.grpcutil import GrpcTls, configure_tls
from tests.core.certs import CertFiles, TestCA
from tests.core.secure_nats import secure_nats_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

USER, PASSWORD = "cv-services", "correct-horse-battery-staple"


@dataclass(frozen=True)
class SecureNats:
    url: str
    ca: TestCA
    client: CertFiles
    seed_file: Path
    seed: str

    def security(self, **changes: str) -> NatsSecurity:
        """TLS with a client certificate, the right user and password, unless ``changes`` say otherwise."""
        base = NatsSecurity(user=USER, password=PASSWORD, tls_ca=str(self.ca.cert),
                            tls_cert=str(self.client.cert), tls_key=str(self.client.key))
        return replace(base, **changes)


def _nkey_user(directory: Path) -> tuple[Path, str, str]:
    """(seed file, seed, public key) of a fresh nkeys user."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    path = directory / "user.nk"
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return path, seed.decode(), public


@pytest.fixture(scope="module")
def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNats]:
    """A nats-server with JetStream that requires TLS, a client certificate from the test CA, and
    either the user/password or the nkey."""
    directory = tmp_path_factory.mktemp("secure-nats")
    ca = TestCA(directory / "ca")
    seed_file, seed, public = _nkey_user(directory)
    users = [f'{{ user: "{USER}", password: "{PASSWORD}" }}', f'{{ nkey: "{public}" }}']
    with secure_nats_server(directory, ca, users) as url:
        yield SecureNats(url, ca, ca.issue("service"), seed_file, seed)


@pytest.fixture(autouse=True)
def no_process_security() -> Iterator[None]:
    yield
    configure_nats(NatsSecurity())
    configure_tls(GrpcTls())


async def round_trip(bus: EventBus) -> bytes:
    """Publish on a subject the bus subscribed to and return what came back."""
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_message(msg: Msg) -> None:
        await got.put(msg.data)

    await bus.subscribe("cv.test.echo", on_message)
    await bus.publish("cv.test.echo", b"over TLS")
    return await asyncio.wait_for(got.get(), timeout=5)


async def test_user_and_password_over_mutual_tls(secure_nats: SecureNats) -> None:
    bus = EventBus(secure_nats.url, "test", connect_timeout_s=3, security=secure_nats.security(),
                   streams={COMPLETIONS_STREAM: (COMPLETIONS_SUBJECT,)})
    try:
        assert await bus.connect() is True
        assert await round_trip(bus) == b"over TLS"
        assert await bus.publish_durable(COMPLETIONS_SUBJECT, b"record") is True  # JetStream acked it
        assert bus.last_error == ""
    finally:
        await bus.close()


async def test_an_nkeys_seed_file(secure_nats: SecureNats) -> None:
    nkey_only = secure_nats.security(user="", password="", nkey_seed_file=str(secure_nats.seed_file))
    bus = EventBus(secure_nats.url, "test", connect_timeout_s=3, security=nkey_only)
    try:
        assert await bus.connect() is True
        assert await round_trip(bus) == b"over TLS"
    finally:
        await bus.close()


async def test_credentials_in_the_url(secure_nats: SecureNats, caplog: pytest.LogCaptureFixture) -> None:
    url = secure_nats.url.replace("nats://", f"nats://{USER}:{PASSWORD}@")
    bus = EventBus(url, "test", connect_timeout_s=3, security=secure_nats.security(user="", password=""))
    caplog.set_level(logging.INFO, logger="clairvoyant.core.bus")
    try:
        assert await bus.connect() is True
    finally:
        await bus.close()
    assert f"connected to NATS at nats://{USER}:***@127.0.0.1" in caplog.text
    assert PASSWORD not in caplog.text


async def test_a_wrong_password_is_refused_with_a_clear_error(
    secure_nats: SecureNats, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-password"
    bus = EventBus(secure_nats.url, "test", connect_timeout_s=2, security=secure_nats.security(password=wrong))
    caplog.set_level(logging.DEBUG, logger="clairvoyant.core.bus")
    try:
        assert await bus.connect() is False
        assert not bus.connected
    finally:
        await bus.close()
    assert "refused this service's credentials (authorization violation)" in bus.last_error
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [bus.last_error]  # once, however often it retried
    assert wrong not in caplog.text


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"tls_cert": "", "tls_key": ""}, "certificate required"),  # the server verifies clients
        ({"tls_ca": ""}, "certificate verify failed"),  # system roots do not know the test CA
    ],
    ids=["no-client-certificate", "untrusted-server"],
)
async def test_tls_failures_are_refused_and_say_why(
    secure_nats: SecureNats, changes: dict[str, str], reason: str
) -> None:
    bus = EventBus(secure_nats.url, "test", connect_timeout_s=2, security=secure_nats.security(**changes))
    try:
        assert await bus.connect() is False
        # On a loaded machine the first attempt's deadline can pass before the TLS error is
        # reported; the background retries report it then.
        for _ in range(200):
            if bus.last_error:
                break
            await asyncio.sleep(0.05)
    finally:
        await bus.close()
    assert bus.last_error.startswith(f"TLS with NATS at {secure_nats.url} failed")
    assert reason in bus.last_error


async def test_plaintext_is_refused(secure_nats: SecureNats) -> None:
    bus = EventBus(secure_nats.url, "test", connect_timeout_s=2, security=NatsSecurity(user=USER, password=PASSWORD))
    try:
        assert await bus.connect() is False
    finally:
        await bus.close()


async def test_a_service_takes_its_bus_security_from_the_settings(secure_nats: SecureNats) -> None:
    """``security.configure`` at start; a bus built without ``security`` then uses the settings'."""
    settings = ServiceSettings(
        nats_url=secure_nats.url, nats_nkey_seed_file=str(secure_nats.seed_file), nats_tls_ca=str(secure_nats.ca.cert),
        nats_tls_cert=str(secure_nats.client.cert), nats_tls_key=str(secure_nats.client.key),
    )
    bus = EventBus(settings.nats_url, "test", connect_timeout_s=3)
    security.configure(settings)
    try:
        assert await bus.connect() is True
        assert await round_trip(bus) == b"over TLS"
    finally:
        await bus.close()


def test_settings_map_onto_connect_options(tmp_path: Path) -> None:
    assert NatsSecurity.from_settings(ServiceSettings(**{})).connect_options("nats://127.0.0.1:4222") == {}
    settings = ServiceSettings(nats_user="u", nats_password="pw-1234", nats_token="tok-5678",  # type: ignore[arg-type]
                               nats_creds_file="/etc/cv/user.creds", nats_tls_server_name="nats.internal")
    options = NatsSecurity.from_settings(settings).connect_options("tls://nats:4222")
    assert (options["user"], options["password"], options["token"]) == ("u", "pw-1234", "tok-5678")
    assert options["user_credentials"] == "/etc/cv/user.creds" and "nkeys_seed" not in options
    assert options["tls_hostname"] == "nats.internal" and options["tls"] is not None  # tls:// means TLS
    assert "pw-1234" not in repr(NatsSecurity.from_settings(settings))


def test_half_configured_credentials_are_a_start_up_error() -> None:
    with pytest.raises(ValueError, match="CV_NATS_USER and CV_NATS_PASSWORD"):
        ServiceSettings(nats_user="u")
    with pytest.raises(ValueError, match="CV_NATS_TLS_CERT and CV_NATS_TLS_KEY"):
        ServiceSettings(nats_tls_cert="client.pem")
