"""Servers from ``new_server`` do not share a port: gRPC's default SO_REUSEPORT would let a second
server bind a port in use and split its traffic (and a bind to port 0 be handed such a port)."""

from __future__ import annotations

import pytest

from clairvoyant.core.grpcutil import new_server

pytestmark = pytest.mark.unit


async def test_a_second_server_cannot_bind_a_port_in_use() -> None:
    first = new_server()
    port = first.add_insecure_port("127.0.0.1:0")
    await first.start()
    second = new_server()
    try:
        try:
            bound = second.add_insecure_port(f"127.0.0.1:{port}")
        except RuntimeError:
            bound = 0  # newer gRPC raises where older ones return 0
        assert bound == 0
    finally:
        await first.stop(None)
        await second.stop(None)
