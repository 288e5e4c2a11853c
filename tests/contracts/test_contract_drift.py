"""The committed stubs in libs/contracts must be exactly what the protos generate."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from clairvoyant.contracts.v1 import scheduler_pb2, worker_pb2

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "libs" / "contracts" / "src" / "clairvoyant" / "contracts" / "v1"


def _generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("cv_generate", ROOT / "libs" / "contracts" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_stubs_match_protos(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in _generator().generate(into=tmp_path)}
    committed = {p.name: p.read_text() for p in COMMITTED.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")}
    assert sorted(fresh) == sorted(committed), "stub files differ: run `make proto` and commit"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"stubs out of date for {stale}: run `make proto` and commit"


@pytest.mark.unit
def test_every_proto_has_stubs() -> None:
    protos = sorted(p.stem for p in (ROOT / "proto" / "clairvoyant" / "v1").glob("*.proto"))
    assert protos == ["autoscaler", "cachemgr", "common", "gateway", "profiler", "scheduler", "worker"]
    for stem in protos:
        assert (COMMITTED / f"{stem}_pb2.py").exists()
        assert (COMMITTED / f"{stem}_pb2.pyi").exists()


@pytest.mark.unit
def test_evolution_policy_header_present() -> None:
    common = (ROOT / "proto" / "clairvoyant" / "v1" / "common.proto").read_text()
    for rule in ("Never reuse", "reserved", "optional", "v2"):
        assert rule in common
    for path in (ROOT / "proto" / "clairvoyant" / "v1").glob("*.proto"):
        assert "Evolution policy" in path.read_text(), path.name


@pytest.mark.unit
def test_optional_fields_distinguish_unset_from_zero() -> None:
    request = scheduler_pb2.ScheduleRequest()
    assert not request.annotations.HasField("expected_remaining_steps")
    request.annotations.expected_remaining_steps = 0.0
    assert request.annotations.HasField("expected_remaining_steps")
    reply = worker_pb2.GenerateResponse()
    assert not reply.HasField("finish_reason")
