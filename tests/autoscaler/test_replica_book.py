"""The autoscaler's replica book and tick input, driven directly (pure core, no I/O)."""

from __future__ import annotations

import pytest

from clairvoyant.autoscaler.config import AutoscalerSettings
from clairvoyant.autoscaler.core import (
    ClusterView,
    ProfileDefaults,
    ReplicaBook,
    WorkerSeen,
    managed_models,
    model_profiles,
    scaling_input,
)
from clairvoyant.policy.scaling import ReplicaPhase

pytestmark = pytest.mark.unit


def worker(worker_id: str, model: str = "m", *, placed: int = 0, waiting: int = 0, batch: int = 8) -> WorkerSeen:
    return WorkerSeen(worker_id, model, placed, placed, waiting, 0.25, False, batch)


def test_a_started_replica_is_ready_when_its_worker_registers() -> None:
    book = ReplicaBook(startup_allowance_s=60.0)
    book.provisioned("local-m-1", "m", 1, now=0.0)
    assert book.observe([], now=5.0).ready == []
    seen = book.observe([worker("local-m-1")], now=9.0)
    assert seen.ready == ["local-m-1"]
    replica = book.get("local-m-1")
    assert replica is not None and replica.phase is ReplicaPhase.READY and replica.since == 9.0


def test_a_pending_replica_takes_the_id_of_the_first_new_worker_of_its_model() -> None:
    book = ReplicaBook(startup_allowance_s=60.0)
    book.observe([worker("static-1")], now=0.0)  # there before: never adopted
    book.provisioned("pending:m:1", "m", 1, now=1.0)
    book.provisioned("pending:other:1", "other", 1, now=1.0)
    seen = book.observe([worker("static-1"), worker("pod-abc"), worker("pod-x", "third")], now=4.0)
    assert seen.ready == ["pod-abc"]
    assert "pod-abc" in book and "pending:m:1" not in book
    assert "pod-x" not in book  # no pending replica of its model: unowned


def test_overdue_starts_are_reported_and_gone_replicas_leave_the_book() -> None:
    book = ReplicaBook(startup_allowance_s=30.0)
    book.provisioned("slow", "m", 1, now=0.0)
    book.provisioned("fine", "m", 1, now=0.0)
    book.observe([worker("fine")], now=2.0)
    assert book.observe([worker("fine")], now=31.0).overdue == ["slow"]
    gone = book.observe([], now=40.0).gone  # the ready one vanished (its process died)
    assert gone == ["fine"]
    assert "fine" not in book


def test_named_renames_a_launch_unless_a_worker_was_matched_to_it_meanwhile() -> None:
    book = ReplicaBook(startup_allowance_s=30.0)
    book.provisioned("pending:m:launch-1", "m", 2, now=0.0)
    book.named("pending:m:launch-1", "local-m-1")
    assert [r.replica_id for r in book.owned()] == ["local-m-1"]
    book.provisioned("pending:m:launch-2", "m", 2, now=1.0)
    book.observe([worker("local-m-1"), worker("local-m-2")], now=2.0)  # registered before named
    book.named("pending:m:launch-2", "local-m-2")
    assert sorted(r.replica_id for r in book.owned()) == ["local-m-1", "local-m-2"]


def test_the_tick_input_counts_owned_and_unowned_replicas_with_their_load() -> None:
    book = ReplicaBook(startup_allowance_s=30.0)
    book.provisioned("mine", "m", 2, now=0.0)
    book.provisioned("coming", "m", 2, now=0.0)
    workers = (worker("mine", placed=3, waiting=1), worker("static-1", "n", placed=2, batch=32))
    book.observe(workers, now=1.0)
    book.draining("mine", now=2.0)
    view = ClusterView(workers=workers, queued={"m": 4, "idle": 0})
    models = managed_models(view, [])
    assert models == ["m", "n"]  # a queue with nothing in it names no model
    profiles = model_profiles(models, view, {"m": {"gpus_per_replica": 2, "startup_s": None}}, ProfileDefaults(45.0))
    assert profiles["m"].gpus_per_replica == 2 and profiles["m"].startup_s == 45.0
    assert profiles["n"].calls_per_replica == 32.0  # its workers' batch
    state = scaling_input(view, book, profiles, gpu_budget=8)
    by_id = {r.replica_id: r for r in state.replicas}
    assert by_id["mine"].phase is ReplicaPhase.DRAINING and by_id["mine"].running == 4
    assert by_id["coming"].phase is ReplicaPhase.STARTING and by_id["coming"].gpus == 2
    assert by_id["static-1"].phase is ReplicaPhase.READY and by_id["static-1"].gpus == 1
    assert state.queued == {"m": 4, "idle": 0}


def test_bad_settings_are_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match="unknown scaling policy 'nope'"):
        AutoscalerSettings(scaling_policy="nope")
    with pytest.raises(ValueError, match="profiles"):
        AutoscalerSettings(profiles='{"m": {"gpus_per_replica": 0}}')
    with pytest.raises(ValueError, match="worker_env"):
        AutoscalerSettings(worker_env="[1, 2]")
