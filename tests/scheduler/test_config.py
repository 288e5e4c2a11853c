"""Settings from CV_* variables and the command line."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clairvoyant.scheduler.__main__ import build_parser, load_settings
from clairvoyant.scheduler.config import SchedulerSettings
from clairvoyant.scheduler.core import PRESETS

pytestmark = pytest.mark.unit


def test_defaults() -> None:
    s = SchedulerSettings()
    assert (s.scheduler_port, s.metrics_port, s.policy, s.max_queue_per_model) == (
        50051,
        9101,
        "fcfs-rr",
        1024,
    )
    assert (s.queue_retry_after_s, s.heartbeat_timeout_factor, s.expiry_interval_s) == (1.0, 3.0, 0.5)


def test_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_SCHEDULER_PORT", "6000")
    monkeypatch.setenv("CV_POLICY", "least-loaded")
    monkeypatch.setenv("CV_MAX_QUEUE_PER_MODEL", "7")
    s = load_settings([])
    assert (s.scheduler_port, s.policy, s.max_queue_per_model) == (6000, "least-loaded", 7)
    s = load_settings(["--port", "6001", "--policy", "fcfs-rr"])
    assert (s.scheduler_port, s.policy) == (6001, "fcfs-rr")


def test_unknown_policy_is_rejected_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_POLICY", "nope")
    with pytest.raises(ValidationError, match="fcfs-rr"):
        SchedulerSettings()


def test_help_lists_every_registered_preset() -> None:
    text = build_parser().format_help()
    assert all(name in text for name in PRESETS.names())
