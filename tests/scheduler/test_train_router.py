"""``python -m clairvoyant.scheduler.train_router``: router profiles from labelled JSONL inputs."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import load_model_groups
from clairvoyant.policy.aragog.classifier import ClassifierRouter
from clairvoyant.policy.aragog.routers import TableRouter
from clairvoyant.scheduler.train_router import main

pytestmark = pytest.mark.unit

GROUPS = {
    "groups": {
        "qwen-auto": {
            "models": {"q7": 7, "q14": 14, "q32": 32},
            "workflows": {"self_refine": {"agents": ["generate", "critique", "refine"]}},
        }
    }
}


@pytest.fixture
def groups_file(tmp_path: Path) -> Path:
    path = tmp_path / "groups.json"
    path.write_text(json.dumps(GROUPS))
    return path


@pytest.fixture
def space(groups_file: Path) -> ConfigSpace:
    group = load_model_groups(groups_file).get("qwen-auto")
    assert group is not None
    space = group.space("self_refine")
    assert space is not None
    return space


def write_examples(path: Path, space: ConfigSpace, count: int, seed: int = 0) -> Path:
    """Inputs of a hidden difficulty (their words tell it); accurate when the configuration's
    strength (sum of option levels) reaches it."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        difficulty = rng.randint(0, 6)
        words = rng.sample([f"word{i}" for i in range(100)], 6) + rng.sample([f"topic{difficulty}x{i}" for i in range(10)], 4)
        accurate = [space.name(c) for c in range(space.size) if sum(space.levels(c)) >= difficulty]
        lines.append(json.dumps({"text": " ".join(words), "input_class": f"d{difficulty}", "accurate": accurate}))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(groups_file: Path, examples: Path, out: Path, kind: str, *extra: str) -> int:
    return main(["--groups", str(groups_file), "--group", "qwen-auto", "--workflow", "self_refine",
                 "--examples", str(examples), "--kind", kind, "--out", str(out), *extra])


def reported_quality(output: str) -> tuple[float, float, int]:
    found = re.search(r"precision (\d\.\d+), recall (\d\.\d+) on (\d+) held-out", output)
    assert found, output
    return float(found[1]), float(found[2]), int(found[3])


def test_table_profile(tmp_path: Path, groups_file: Path, space: ConfigSpace, capsys: pytest.CaptureFixture[str]) -> None:
    examples = write_examples(tmp_path / "examples.jsonl", space, 150)
    out = tmp_path / "profiles" / "self_refine.json"
    assert run(groups_file, examples, out, "table") == 0
    precision, recall, held_out = reported_quality(capsys.readouterr().out)
    assert (precision, recall, held_out) == (1.0, 1.0, 30)
    router = TableRouter.from_dict(json.loads(out.read_text()))
    assert router.workflow_type == "self_refine"
    hard = router.accurate_mask(space, "topic6x1 topic6x2 topic6x3")
    assert hard == 1 << space.reference
    easy = router.accurate_mask(space, "topic0x1 topic0x2 topic0x3")
    assert easy == space.everything


def test_classifier_profile(tmp_path: Path, groups_file: Path, space: ConfigSpace,
                            capsys: pytest.CaptureFixture[str]) -> None:
    examples = write_examples(tmp_path / "examples.jsonl", space, 200)
    out = tmp_path / "self_refine.pkl"
    assert run(groups_file, examples, out, "classifier", "--seed", "1") == 0
    precision, recall, held_out = reported_quality(capsys.readouterr().out)
    assert held_out == 40 and precision >= 0.85 and recall >= 0.7
    router = ClassifierRouter.loads(out.read_bytes())
    assert router.config_names == tuple(space.name(c) for c in range(space.size))
    assert router.predict(space, "topic6x1 topic6x2 word3", [space.base, space.reference]) == [False, True]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"text": "x", "accurate": []}', "expected an object with keys"),
        ('{"text": 3, "input_class": "c", "accurate": []}', "must be strings"),
        ('{"text": "x", "input_class": "c", "accurate": "q7+q7+q7"}', "must be a list"),
        ('{"text": "x", "input_class": "c", "accurate": ["q7+q7"]}', "'q7+q7' is not a configuration"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, groups_file: Path, space: ConfigSpace,
                                              capsys: pytest.CaptureFixture[str], line: str, message: str) -> None:
    examples = write_examples(tmp_path / "examples.jsonl", space, 3)
    examples.write_text(examples.read_text() + "\n" + line + "\n")  # line 4 blank, line 5 bad
    out = tmp_path / "profile.json"
    assert run(groups_file, examples, out, "table") == 1
    error = capsys.readouterr().err
    assert f"{examples}:5: " in error and message in error
    assert not out.exists()


def test_too_few_inputs_to_hold_out(tmp_path: Path, groups_file: Path, space: ConfigSpace,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    examples = write_examples(tmp_path / "examples.jsonl", space, 4)
    assert run(groups_file, examples, tmp_path / "p.json", "table") == 1
    assert "five or more" in capsys.readouterr().err


def test_usage_errors_exit_with_2(tmp_path: Path, groups_file: Path, space: ConfigSpace,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    examples = write_examples(tmp_path / "examples.jsonl", space, 20)
    out = tmp_path / "p.json"
    assert run(groups_file, examples, out, "lookup") == 2  # not a router kind
    assert "invalid choice" in capsys.readouterr().err
    assert main(["--groups", str(groups_file)]) == 2  # missing arguments
    assert run(tmp_path / "missing.yaml", examples, out, "table") == 2
    assert "cannot read model groups file" in capsys.readouterr().err
    assert main(["--groups", str(groups_file), "--group", "other", "--workflow", "self_refine",
                 "--examples", str(examples), "--kind", "table", "--out", str(out)]) == 2
    assert "no model group 'other'" in capsys.readouterr().err
    assert main(["--groups", str(groups_file), "--group", "qwen-auto", "--workflow", "voting",
                 "--examples", str(examples), "--kind", "table", "--out", str(out)]) == 2
    assert "declares no workflow 'voting'" in capsys.readouterr().err
    assert run(groups_file, tmp_path / "missing.jsonl", out, "table") == 2
    assert "cannot read examples file" in capsys.readouterr().err
    assert not out.exists()
