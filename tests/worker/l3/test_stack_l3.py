"""``make run``'s part in the L3: the log line naming it, and the ``mooncake_master`` the stack
runs when the workers' ``CV_L3_URL`` names one on this machine."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from clairvoyant.stack import Stack, StackConfig
from clairvoyant.stack.l3 import l3_summary, plan_local_l3
from clairvoyant.stack.launcher import MOONCAKE_MASTER
from clairvoyant.stack.natsserver import free_port, port_open
from clairvoyant.worker.core.l3 import page_key
from clairvoyant.worker.l3 import open_l3


@pytest.mark.unit
@pytest.mark.parametrize(("url", "line"), [
    ("", "L3: none"),
    ("file:///var/cv/l3?max_gb=4", "L3: file /var/cv/l3"),
    ("redis://:secret@cache.internal:6380/2?ttl_s=60", "L3: redis cache.internal:6380/2"),
    ("redis://127.0.0.1", "L3: redis 127.0.0.1:6379/0"),
    ("memory://", "L3: memory (each worker its own)"),
    ("mooncake://10.0.0.5:50051?metadata=http://10.0.0.5:8080/metadata",
     "L3: mooncake, master 10.0.0.5:50051, metadata http://10.0.0.5:8080/metadata"),
])
def test_the_log_names_the_l3_and_where_it_is(url: str, line: str) -> None:
    assert l3_summary(url) == line


@pytest.mark.unit
@pytest.mark.parametrize("url", ["", "file:///tmp/l3", "redis://127.0.0.1:6379/0", "mooncake://10.0.0.5:50051"])
def test_only_a_mooncake_master_on_this_machine_is_started(url: str, tmp_path: Path) -> None:
    plan = plan_local_l3(url, tmp_path)
    assert plan.master is None
    assert plan.worker_url == url


@pytest.mark.unit
def test_a_master_without_ports_gets_free_ones_and_the_workers_their_url(tmp_path: Path) -> None:
    plan = plan_local_l3("mooncake://localhost?segment_mb=32", tmp_path)
    assert plan.master is not None
    worker_url = urlsplit(plan.worker_url)
    params = dict(parse_qsl(worker_url.query))
    assert worker_url.netloc == f"127.0.0.1:{plan.master.rpc_port}"
    assert params == {"segment_mb": "32", "metadata": f"http://127.0.0.1:{plan.master.metadata_port}/metadata"}
    assert plan.master.log_path == tmp_path / "mooncake-master.log"
    assert "(started here" in plan.description


@pytest.mark.unit
def test_ports_the_url_names_are_kept(tmp_path: Path) -> None:
    rpc_port, metadata_port = free_port(), free_port()
    plan = plan_local_l3(f"mooncake://127.0.0.1:{rpc_port}?metadata=http://localhost:{metadata_port}/metadata",
                         tmp_path)
    assert plan.master is not None
    assert (plan.master.rpc_port, plan.master.metadata_port) == (rpc_port, metadata_port)


@pytest.mark.unit
def test_a_master_already_answering_is_used_not_started(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        plan = plan_local_l3(f"mooncake://127.0.0.1:{port}", tmp_path)
    assert plan.master is None
    assert plan.description.endswith("(already running; not started here)")


@pytest.mark.integration
def test_the_stack_runs_a_master_its_workers_can_use_and_stops_it(
        mooncake_available: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    stack = Stack(StackConfig(var_dir=tmp_path, worker_env={"CV_L3_URL": "mooncake://localhost?segment_mb=32"}))
    caplog.set_level(logging.INFO, logger="clairvoyant.stack")
    stack.start_l3("mooncake://localhost?segment_mb=32")
    try:
        master = stack.mooncake_master
        assert master is not None and port_open("127.0.0.1", master.rpc_port)
        assert [service.name for service in stack.services] == [MOONCAKE_MASTER]
        assert any(record.getMessage().startswith("L3: mooncake, master 127.0.0.1:") for record in caplog.records)
        store = open_l3(stack.l3_url)  # what a worker would open
        try:
            key = page_key("model", None, 1)
            assert store.put([key], [b"page"]) == 1
            assert store.get([key]) == [b"page"]
        finally:
            store.close()
    finally:
        stack.stop()
    assert master.process is not None and master.process.returncode is not None
    assert not port_open("127.0.0.1", master.rpc_port)


def test_the_stacks_workers_get_the_embedded_file_l3_unless_told_otherwise(tmp_path: Path) -> None:
    from clairvoyant.stack.launcher import DEFAULT_L3_GB, default_l3_url

    assert default_l3_url({}, tmp_path) == f"file://{(tmp_path / 'l3').resolve()}?max_gb={DEFAULT_L3_GB}"
    assert default_l3_url({"CV_L3_URL": "redis://127.0.0.1:6379/0"}, tmp_path) == "redis://127.0.0.1:6379/0"
    assert default_l3_url({"CV_L3_URL": ""}, tmp_path) == ""  # set and empty: no L3
    assert default_l3_url({"CV_HOST_CACHE_RATIO": "0"}, tmp_path) == ""  # no L2 to stage pages through
    assert default_l3_url({"CV_HOST_CACHE_RATIO": "0", "CV_HOST_CACHE_GB": "1"}, tmp_path).startswith("file://")
