"""Trace-driven workloads: chatdev and claude_code replay the real runs under the shared data dir."""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from clairvoyant.bench.workloads import TraceWorkload, WorkloadDataError, get_workload
from clairvoyant.workloads.data import DATA_DIR_ENV, data_dir, repo_root
from clairvoyant.workloads.traces import CHATDEV_CALLS, WEKA_CALLS

pytestmark = pytest.mark.unit


def load(name: str) -> TraceWorkload:
    try:
        workload = get_workload(name)
    except WorkloadDataError as exc:
        pytest.skip(str(exc))
    assert isinstance(workload, TraceWorkload)
    return workload


def rows(relative: str) -> dict[str, list[dict[str, str]]]:
    runs: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(data_dir() / relative, newline="") as f:
        for row in csv.DictReader(f):
            runs[row["session" if "session" in row else "trace_id"]].append(row)
    return runs


def test_the_data_dir_is_next_to_the_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert data_dir() == repo_root().parent / "shared" / "data"
    assert (repo_root() / "bench").is_dir()
    monkeypatch.setenv(DATA_DIR_ENV, "/somewhere/else")
    assert data_dir() == Path("/somewhere/else")


@pytest.mark.parametrize(("name", "missing"), [("chatdev", CHATDEV_CALLS), ("claude_code", WEKA_CALLS)])
def test_missing_data_is_a_clear_error_naming_the_path(
    name: str, missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(WorkloadDataError, match=str(tmp_path / missing)) as caught:
        get_workload(name)
    assert DATA_DIR_ENV in str(caught.value)


def test_chatdev_replays_each_run_call_by_call() -> None:
    workload = load("chatdev")
    recorded = rows(CHATDEV_CALLS)
    assert len(workload.runs) == len(recorded) == 58
    for run in workload.runs:
        program = workload.replay(run.run_id, run.run_id)
        program.check_integrity()
        source = sorted(recorded[run.run_id], key=lambda r: int(r["call_idx"]))
        assert [c.prompt_tokens for c in program.calls] == [max(1, int(r["prompt_tokens"])) for r in source]
        assert [c.output_tokens for c in program.calls] == [
            max(1, int(r["completion_tokens"])) for r in source
        ]
        # A sequential run: each call waits for the one before.
        assert all(c.dependencies == (program.calls[c.index - 1].call_id,) for c in program.calls[1:])
    # Roles become agents; the phase sequence shows in the order (review comments, then modifications).
    stats = workload.stats()
    assert {"programmer", "code_reviewer", "chief_product_officer", "chief_technology_officer"} <= set(
        stats.agents
    )
    assert (
        stats.agents["programmer"].calls_per_workflow
        > stats.agents["chief_technology_officer"].calls_per_workflow
    )


def test_chatdev_continued_chats_reuse_the_previous_prompt() -> None:
    workload = load("chatdev")
    program = workload.replay("2048_THUNLP_20230822144615__20230822144615", "w")
    # Calls 4 and 5 are one CodeReviewComment chat: 2332 = 2064 + 238 + 30 new tokens.
    assert [tuple(s) for s in program.calls[5].prompt] == [
        ("call", "w/4", "prompt", 2064),
        ("call", "w/4", "response", 238),
        ("new", 30),
    ]
    # A new phase starts from the role's system prompt.
    assert program.calls[4].prompt[0].kind == "system"


def test_claude_code_replays_sessions_with_subagents_and_prefix_reuse() -> None:
    workload = load("claude_code")
    recorded = rows(WEKA_CALLS)
    assert len(workload.runs) == len(recorded) == 710
    assert sum(len(run.calls) for run in workload.runs) == 49_334
    program = workload.replay("trace_0010", "s")
    program.check_integrity()
    source = recorded["trace_0010"]
    assert Counter(c.agent_id for c in program.calls) == Counter(
        "main" if r["agent_id"] == "main" else r["agent_type"].lower() for r in source
    )
    assert sorted(c.prompt_tokens for c in program.calls) == sorted(int(r["in_tokens"]) for r in source)
    # Sub-agents fan out from a main call (a different, smaller model) and are joined by a later one.
    sub_starts = [
        c
        for c in program.calls
        if c.agent_id == "explore" and program.call(c.dependencies[0]).agent_id == "main"
    ]
    assert len(sub_starts) == 4 and all(c.model == "llama-3.1-8b" for c in sub_starts)
    joins = [c for c in program.calls if c.agent_id == "main" and len(c.dependencies) > 1]
    assert joins
    # 96% of blocks are shared with the previous call: most prompts start with the previous prompt.
    calls = [c for run in workload.runs[:100] for c in workload.replay(run.run_id, "x").calls]
    reusing = sum(c.prompt[0].kind == "call" for c in calls) / len(calls)
    assert reusing > 0.9
    reused = sum(s.tokens for c in calls for s in c.prompt if s.kind == "call") / sum(
        c.prompt_tokens for c in calls
    )
    assert reused > 0.9


def test_claude_code_think_time_is_tool_latency_and_can_be_capped() -> None:
    workload = load("claude_code")
    program = workload.replay("trace_0010", "s")
    main = [c for c in program.calls if c.agent_id == "main"]
    assert main[0].tool == "tool" and main[0].tool_latency_s == 98.0  # think_time of main call 1
    capped = get_workload("claude_code", max_tool_latency_s=30.0)
    assert max(c.tool_latency_s for c in capped.instantiate(np.random.default_rng(0), "w").calls) <= 30.0


def test_trace_workloads_pick_runs_with_the_rng() -> None:
    workload = load("chatdev")
    rng = np.random.default_rng(0)
    lengths = {len(workload.instantiate(rng, f"w{i}")) for i in range(40)}
    assert len(lengths) > 5  # different runs
    stats = workload.stats()
    assert stats.calls_per_workflow == pytest.approx(np.mean([len(r.calls) for r in workload.runs]))
