"""What the simulator's annotations carry for the cache policies: the profiler learns prompt
templates from the calls' block-hash chains (hashed only for an annotator that asks), the oracle
gives the remaining path, and ``cache-replay`` runs with the profiler's annotations by default."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import pytest

from clairvoyant.bench import cache_replay
from clairvoyant.bench.records import CallResult
from clairvoyant.bench.sim import cache_manager
from clairvoyant.bench.sim.annotations import OracleAnnotator, ProfilerAnnotator, warm_up
from clairvoyant.bench.sim.simulator import Annotator, ReplicaSpec, Simulator, SteppedRunner
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.bench.workloads import get_workload
from clairvoyant.core.annotations import Confidence, SysAnnotations
from clairvoyant.policy.cache import CompletedCall
from clairvoyant.profiler import core as profiler
from clairvoyant.profiler.core import expr
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.workloads.program import Call, CallSegment, NewSegment, SystemSegment, WorkflowProgram

pytestmark = pytest.mark.unit

CONVERSATION_TEMPLATE = "${{{agent}[-1]:prompt:[0,$]}}${{{agent}[-1]:response:[0,$]}}${{new}}"


def conversation(wf: str) -> WorkflowProgram:
    """plan (48-token prompt, 16 out) -> code (plan's prompt and response + 16 new, 16 out) ->
    review (code's prompt and response + 8 new, 8 out): each prompt continues the one before."""
    calls = (
        Call(f"{wf}/0", 0, "plan", "unit", (SystemSegment("system", "plan", 32), NewSegment("new", 16)), 48, 16, ()),
        Call(f"{wf}/1", 1, "code", "unit", (CallSegment("call", f"{wf}/0", "prompt", 48),
             CallSegment("call", f"{wf}/0", "response", 16), NewSegment("new", 16)), 80, 16, (f"{wf}/0",)),
        Call(f"{wf}/2", 2, "review", "unit", (CallSegment("call", f"{wf}/1", "prompt", 80),
             CallSegment("call", f"{wf}/1", "response", 16), NewSegment("new", 8)), 104, 8, (f"{wf}/1",)),
    )  # fmt: skip
    return WorkflowProgram("conversation", wf, calls)


def _call(wf: str, index: int, agent: str, deps: tuple[int, ...] = ()) -> Call:
    return Call(f"{wf}/{index}", index, agent, "unit", (NewSegment("new", 4),), 4, 2,
                tuple(f"{wf}/{d}" for d in deps))  # fmt: skip


def fan_outs(wf: str) -> WorkflowProgram:
    """plan -> search x2 -> (read, write) -> merge: one agent's fan-out, then two agents'."""
    calls = (
        _call(wf, 0, "plan"),
        _call(wf, 1, "search", (0,)),
        _call(wf, 2, "search", (0,)),
        _call(wf, 3, "write", (1, 2)),
        _call(wf, 4, "read", (1,)),
        _call(wf, 5, "merge", (3, 4)),
    )
    return WorkflowProgram("fan_outs", wf, calls)


def replicas(count: int = 2) -> list[ReplicaSpec]:
    config = EngineConfig(block_size=16, num_blocks=256, max_num_seqs=4)
    # cast: its ByteTokenizer is a Tokenizer structurally, but mypy sees the attribute as invariant.
    return [ReplicaSpec(f"w{i}", cast(SteppedRunner, UnitTimeRunner()), config) for i in range(count)]


def arrivals(count: int, prefix: str = "w") -> list[tuple[float, WorkflowProgram]]:
    return [(float(i), conversation(f"{prefix}{i}")) for i in range(count)]


def quick_profiler(needs_completions: bool = True) -> ProfilerAnnotator:
    """A profiler that predicts after 4 instances (the default waits for 30 and convergence)."""
    config = profiler.ProfileConfig(
        confidence=profiler.ConfidenceConfig(min_instances=4, require_convergence=False)
    )
    annotator = ProfilerAnnotator(profiler.ProfileStore(config))
    annotator.needs_completions = needs_completions
    return annotator


class Recording:
    """Annotates nothing; records the completion record each end brought."""

    def __init__(self, needs_completions: bool) -> None:
        self.needs_completions = needs_completions
        self.observed: list[tuple[str, CompletedCall | None]] = []

    def annotate(self, program: WorkflowProgram, call: Call, now: float) -> SysAnnotations | None:
        return None

    def observe(
        self,
        program: WorkflowProgram,
        record: CallResult,
        last: bool,
        completion: CompletedCall | None = None,
    ) -> None:
        self.observed.append((record.call_id, completion))


# ---- the profiler learns templates from the chains ----------------------------------------------


def test_the_profiler_learns_each_next_prompts_template_from_the_simulated_chains() -> None:
    annotator = quick_profiler()
    warm_up(annotator, replicas(), arrivals(8))
    program = conversation("measured")
    got = [annotator.annotate(program, call, 0.0) for call in program.calls]
    assert [a.confidence for a in got] == [Confidence.LOW] * 3
    # The next prompt continues the current call's conversation: its prompt, then its response.
    assert [a.prompt_composition for a in got] == [
        CONVERSATION_TEMPLATE.format(agent="plan"),
        CONVERSATION_TEMPLATE.format(agent="code"),
        "",  # review is the last call: no next prompt
    ]
    assert [a.predicted_path_regex for a in got] == ["code -> review -> $", "review -> $", "$"]


def test_without_the_chains_the_profiler_predicts_the_path_but_no_template() -> None:
    annotator = quick_profiler(needs_completions=False)
    warm_up(annotator, replicas(), arrivals(8))
    program = conversation("measured")
    got = [annotator.annotate(program, call, 0.0) for call in program.calls]
    assert [a.predicted_path_regex for a in got] == ["code -> review -> $", "review -> $", "$"]
    assert [a.prompt_composition for a in got] == ["", "", ""]


# ---- the simulator hands the chains over only when asked ----------------------------------------


def test_an_annotator_that_asks_gets_the_completion_records_the_cache_manager_gets() -> None:
    annotator = Recording(needs_completions=True)
    sim = Simulator(replicas(), "fcfs-rr", annotator=annotator, record_completions=True)
    sim.run(arrivals(2))
    assert [call_id for call_id, _ in annotator.observed] == [c.request_id for c in sim.completions]
    assert [completion for _, completion in annotator.observed] == sim.completions
    chains = {
        c.request_id: (c.prompt_block_hashes, c.response_block_hashes)
        for _, c in annotator.observed
        if c is not None
    }
    for wf in ("w0", "w1"):
        plan, code, review = (chains[f"{wf}/{i}"] for i in range(3))
        # 48 + 16, 80 + 16, 104 + 8 tokens in 16-token blocks (104 = 6.5 blocks: the tail joins the output).
        assert [(len(p), len(r)) for p, r in (plan, code, review)] == [(3, 1), (5, 1), (6, 1)]
        assert code[0][:4] == plan[0] + plan[1]  # code's prompt continues plan's sequence
        assert review[0][:6] == code[0] + code[1]
    w0_plan, w1_plan = chains["w0/0"][0], chains["w1/0"][0]
    assert w0_plan[:2] == w1_plan[:2] and w0_plan[2] != w1_plan[2]  # one system prompt, then each its own


def _counting_hashes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the completion records' hashings (the real function still does the work)."""
    counted: list[int] = []
    real: Callable[..., tuple[list[int], list[int]]] = cache_manager.sequence_hashes

    def counting(
        prompt_ids: Sequence[int], output_ids: Sequence[int], block_tokens: int = 16
    ) -> tuple[list[int], list[int]]:
        counted.append(len(prompt_ids))
        return real(prompt_ids, output_ids, block_tokens)

    monkeypatch.setattr(cache_manager, "sequence_hashes", counting)
    return counted


@pytest.mark.parametrize(
    ("make", "hashed"),
    [(lambda: None, 0), (OracleAnnotator, 0), (lambda: Recording(needs_completions=False), 0),
     (lambda: Recording(needs_completions=True), 6)],
    ids=["none", "oracle", "not asking", "asking"],
)  # fmt: skip
def test_chains_are_hashed_only_for_an_annotator_that_asks(
    monkeypatch: pytest.MonkeyPatch, make: Callable[[], Annotator | None], hashed: int
) -> None:
    counted = _counting_hashes(monkeypatch)
    annotator = make()
    Simulator(replicas(), "fcfs-rr", annotator=annotator).run(arrivals(2))
    assert len(counted) == hashed
    if isinstance(annotator, Recording):
        assert sum(completion is not None for _, completion in annotator.observed) == hashed


def test_hashing_for_an_annotator_leaves_every_record_as_without_one() -> None:
    def records(annotator: Annotator | None) -> list[dict[str, object]]:
        run = Simulator(replicas(), "fcfs-rr", annotator=annotator).run(arrivals(6))
        return [dataclasses.asdict(call) for call in run.calls]

    assert records(Recording(needs_completions=True)) == records(None)


# ---- the oracle's remaining path ----------------------------------------------------------------


def test_the_oracles_path_is_the_remaining_steps_in_the_profilers_grammar() -> None:
    program = fan_outs("f")
    paths = [OracleAnnotator().annotate(program, call, 0.0).predicted_path_regex for call in program.calls]
    assert paths == [
        "<search>{2} -> <read | write>{2} -> merge -> $",  # plan
        "<read | write>{2} -> merge -> $",  # search
        "<read | write>{2} -> merge -> $",
        "merge -> $",  # write
        "merge -> $",  # read
        "$",  # merge
    ]
    parsed = expr.parse(paths[0])
    assert isinstance(parsed, expr.Seq) and parsed.items[0] == expr.FanOut(expr.Agent("search"), 2, 2)
    assert parsed.items[-1] == expr.End()


def _remaining_agents(program: WorkflowProgram) -> dict[str, frozenset[str]]:
    """Per call, the agents of the calls deeper in the DAG (computed here from the dependencies)."""
    depth: dict[str, int] = {}
    for call in program.calls:
        depth[call.call_id] = max((depth[d] + 1 for d in call.dependencies), default=0)
    return {
        call.call_id: frozenset(c.agent_id for c in program.calls if depth[c.call_id] > depth[call.call_id])
        for call in program.calls
    }


@pytest.mark.parametrize("name", ["deep_research", "coding_assistant", "swe_agent"])
def test_the_oracles_paths_parse_and_name_exactly_the_remaining_calls_agents(name: str) -> None:
    workload = get_workload(name)
    rng = np.random.default_rng(0)
    oracle = OracleAnnotator()
    checked = 0
    for index in range(6):
        program = workload.instantiate(rng, f"{name}-{index}")
        remaining = _remaining_agents(program)
        for call in program.calls:
            path = oracle.annotate(program, call, 0.0).predicted_path_regex
            assert expr.agents_of(expr.parse(path)) == remaining[call.call_id], path
            assert path.endswith("$") and (path == "$") == (not remaining[call.call_id])
            checked += 1
    assert checked > 6 * 3


# ---- cache-replay's default annotations ---------------------------------------------------------


def _replay_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cache_replay.CacheReplay().add_arguments(parser)
    return parser.parse_args(argv)


def test_cache_replay_runs_on_the_profilers_annotations_with_a_warm_up_by_default() -> None:
    args = _replay_args(["--workflows", "4", "--concurrency", "4"])
    assert (args.annotations, args.warmup_workflows) == ("profiler", 64)
    calls = cache_replay.simulate("deep_research", args)
    annotated = [c.annotations for c in calls if c.annotations is not None]
    assert len(annotated) == len(calls) > 0
    # Trained on the warm-up, the profiler predicts the path and (but for the last calls) the next prompt.
    assert all(a.predicted_path_regex for a in annotated)
    with_template = sum(bool(a.prompt_composition) for a in annotated)
    assert with_template >= len(calls) - 4  # at most one last call per workflow lacks it
    oracle = cache_replay.simulate(
        "deep_research", _replay_args(["--workflows", "4", "--annotations", "oracle"])
    )
    assert all(c.annotations is not None and not c.annotations.prompt_composition for c in oracle)
