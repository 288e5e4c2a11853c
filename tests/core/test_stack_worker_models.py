"""Which model each of the launcher's workers serves: one model on N workers, an explicit list
(``CV_WORKER_MODELS``), or one worker per model of the declared groups (``CV_MODEL_GROUPS``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clairvoyant.core.model_groups import ModelGroupError
from clairvoyant.stack import StackConfig
from clairvoyant.stack.natsserver import can_bind

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "model-groups.example.yaml"


def test_one_model_on_every_worker_by_default() -> None:
    assert StackConfig(model="tiny-random", workers=3).models_of_workers() == ["tiny-random"] * 3


def test_an_explicit_list_wins_over_groups_and_counts(tmp_path: Path) -> None:
    config = StackConfig(workers=5, worker_models=("a", "b"), model_groups=tmp_path / "absent.yaml")
    assert config.models_of_workers() == ["a", "b"]  # the groups file is not even read


def test_groups_start_one_worker_per_model_they_name(tmp_path: Path) -> None:
    assert StackConfig(model_groups=EXAMPLE).models_of_workers() == ["qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b"]
    two = tmp_path / "groups.yaml"
    two.write_text("groups:\n  small: {models: [a, b]}\n  large: {models: [b, c]}\n")
    assert StackConfig(model_groups=two).models_of_workers() == ["a", "b", "c"]  # b once
    with pytest.raises(ModelGroupError, match="cannot read model groups file"):
        StackConfig(model_groups=tmp_path / "absent.yaml").models_of_workers()


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CV_WORKER_MODELS", " qwen2.5-7b, qwen2.5-32b ,")
    monkeypatch.setenv("CV_MODEL_GROUPS", str(EXAMPLE))
    config = StackConfig.from_env()
    assert (config.worker_models, config.model_groups) == (("qwen2.5-7b", "qwen2.5-32b"), EXAMPLE)
    monkeypatch.setenv("CV_WORKER_MODELS", "")
    monkeypatch.setenv("CV_MODEL_GROUPS", "")
    assert (StackConfig.from_env().worker_models, StackConfig.from_env().model_groups) == ((), None)


def test_private_stacks_reserve_ports_for_every_worker_the_groups_start(tmp_path: Path) -> None:
    config = StackConfig.on_free_ports(tmp_path, model_groups=EXAMPLE)
    assert len(config.models_of_workers()) == 3  # more than the default two workers
    ports = [base + i for base in (config.worker_grpc_base, config.worker_http_base) for i in range(3)]
    assert len(set(ports)) == 6 and all(can_bind("127.0.0.1", port) for port in ports)
