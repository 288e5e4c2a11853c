"""Workflows to evaluate on: workload programs (``clairvoyant.workloads``), timed, with block-hash
chains on their records.

Sources (``--data``):

* ``chatdev`` — the replay of the 58 ChatDev runs with calls (``chatdev_warehouse``).  Agents
  are the speaking **roles** (CEO, CPO, CTO, Programmer, Code Reviewer, ...), as the trace reader parses
  them, not the phases: a role is one system prompt and one LLM persona, which is what a serving
  system sees as an agent (and what a prompt template's static prefix belongs to); the phase
  sequence still shows in the role sequence, because each ChatChain phase is a fixed pair of roles.
* ``claude_code`` — the replay of the 710 Claude Code sessions: the ``main`` agent and one
  agent per sub-agent type (``explore``, ``plan``, ``general_purpose``).
* ``workload:<name>`` — programs generated from a workload spec (``coding_assistant``, ...).
* ``synthetic:per_task_experts`` — planner -> expert_<k> -> reviewer with 150 expert names, most seen
  once (``synthetic.py``): agents the profiler has never seen.

Every program is a static DAG (``clairvoyant.workloads``, as the bench's simulator replays them).
Timing: a call starts when its dependencies and their tools have finished, and takes
``service_time`` (an unloaded server: ``SERVICE_BASE_S`` + prompt / ``PREFILL_TOKENS_PER_S`` +
output / ``DECODE_TOKENS_PER_S``); workflows arrive as a Poisson process at ``concurrency`` /
(mean makespan), so about ``concurrency`` run at once and their requests interleave as on a shared
cluster.  Recorded tool gaps are kept (Claude Code's idle humans capped at ``MAX_TOOL_LATENCY_S``).

Prompts become token ids from their composition (system prompt per agent, earlier calls' prompts
and responses copied, fresh tokens), so the block-hash chains on the records share exactly the
prefixes the workload says; only the first ``hash_tokens`` tokens of each sequence are hashed (0:
no chains), which keeps 100K-token Claude Code prompts affordable while preserving every prefix
relation within that window.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from clairvoyant.core.blockhash import chain_hashes, sequence_hashes
from clairvoyant.profiler.core.profile import CallRecord
from clairvoyant.profiler.evaluation.synthetic import load_per_task_experts
from clairvoyant.workloads import Call as ProgramCall
from clairvoyant.workloads import (
    CallSegment,
    SystemSegment,
    TraceWorkload,
    WorkflowProgram,
    WorkloadDataError,
    check_workload_name,
    get_workload,
)
from clairvoyant.workloads.errors import TraceFormatError

SERVICE_BASE_S = 0.05
PREFILL_TOKENS_PER_S = 10_000.0
DECODE_TOKENS_PER_S = 40.0
MAX_TOOL_LATENCY_S = 600.0
VOCAB = 32_000
WORKLOAD_PREFIX = "workload:"


class DataError(Exception):
    """A ``--data`` value that names nothing, or trace data that is missing."""


@dataclass(frozen=True, slots=True)
class Workflow:
    workflow_id: str
    records: tuple[CallRecord, ...]  # in program order; the last to end carries workflow_end

    @property
    def end(self) -> float:
        return max(r.end for r in self.records)


def service_time(prompt_tokens: int, output_tokens: int) -> float:
    return SERVICE_BASE_S + prompt_tokens / PREFILL_TOKENS_PER_S + output_tokens / DECODE_TOKENS_PER_S


class _Tokens:
    """Token ids of one workflow's prompts and responses, each cut at ``cap`` tokens."""

    def __init__(self, workflow_type: str, seed: int, cap: int) -> None:
        self.workflow_type = workflow_type
        self.seed = seed
        self.cap = cap
        self.prompts: dict[str, list[int]] = {}
        self.responses: dict[str, list[int]] = {}

    def _fresh(self, key: str, n: int) -> list[int]:
        rng = np.random.default_rng([zlib.crc32(key.encode()), self.seed])
        return rng.integers(0, VOCAB, size=max(n, 0)).tolist()

    def chains(self, call: ProgramCall) -> tuple[tuple[int, ...], tuple[int, ...]]:
        ids: list[int] = []
        for seg in call.prompt:
            want = min(seg.tokens, self.cap - len(ids))
            if want <= 0:
                break
            if isinstance(seg, SystemSegment):
                key = f"system/{self.workflow_type}/{seg.agent_id}"
                rng = np.random.default_rng([zlib.crc32(key.encode()), 0])  # fixed across workflows
                ids += rng.integers(0, VOCAB, size=want).tolist()
            elif isinstance(seg, CallSegment):
                source = (self.prompts if seg.part == "prompt" else self.responses)[seg.call_id]
                ids += source[:want] + self._fresh(f"{call.call_id}/pad{len(ids)}", want - len(source))
            else:
                ids += self._fresh(f"{call.call_id}/new{len(ids)}", want)
        output = self._fresh(f"{call.call_id}/out", min(call.output_tokens, self.cap))
        self.prompts[call.call_id] = ids
        self.responses[call.call_id] = output
        if call.prompt_tokens > self.cap:
            return tuple(chain_hashes(ids)), ()
        prompt, response = sequence_hashes(ids, output[: self.cap - len(ids)])
        return tuple(prompt), tuple(response)


def timed_workflows(
    programs: Sequence[WorkflowProgram], *, seed: int, concurrency: float, hash_tokens: int
) -> list[Workflow]:
    """Time the programs (module doc) and turn their calls into records."""
    relative: list[dict[str, tuple[float, float]]] = []
    for program in programs:
        times: dict[str, tuple[float, float]] = {}
        for call in program.calls:
            start = max(
                (times[d][1] + program.call(d).tool_latency_s for d in call.dependencies),
                default=0.0,
            )
            times[call.call_id] = (start, start + service_time(call.prompt_tokens, call.output_tokens))
        relative.append(times)
    makespan = float(np.mean([max(e for _, e in t.values()) for t in relative])) if relative else 1.0
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(makespan / max(concurrency, 1e-9), size=len(programs))
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)[:-1]]) if len(programs) else gaps
    workflows = []
    for program, times, arrival in zip(programs, relative, arrivals, strict=True):
        tokens = _Tokens(program.workflow_type, seed, hash_tokens) if hash_tokens > 0 else None
        last = max(times, key=lambda cid: (times[cid][1], cid))
        records = []
        for call in program.calls:
            start, end = times[call.call_id]
            prompt_blocks, response_blocks = tokens.chains(call) if tokens is not None else ((), ())
            records.append(
                CallRecord(
                    call.call_id,
                    program.workflow_id,
                    call.agent_id,
                    float(arrival + start),
                    float(arrival + end),
                    call.prompt_tokens,
                    call.output_tokens,
                    program.call(call.dependencies[0]).agent_id if call.dependencies else None,
                    tuple(call.dependencies),
                    workflow_end=call.call_id == last,
                    prompt_blocks=prompt_blocks,
                    response_blocks=response_blocks,
                    model=call.model or None,
                )
            )
        workflows.append(Workflow(program.workflow_id, tuple(records)))
    return workflows


# ------------------------------------------------------------------------------------ sources


def _trace_programs(name: str) -> Callable[[int, int | None, Path | None], list[WorkflowProgram]]:
    def load(seed: int, limit: int | None, data_dir: Path | None) -> list[WorkflowProgram]:
        try:
            workload = get_workload(name, data_dir=data_dir, max_tool_latency_s=MAX_TOOL_LATENCY_S)
        except WorkloadDataError as exc:
            given = "" if data_dir is None else " (from --data-dir)"
            raise DataError(f"{exc}{given}") from exc
        except TraceFormatError as exc:
            raise DataError(str(exc)) from exc
        assert isinstance(workload, TraceWorkload)
        runs = workload.runs[:limit] if limit is not None else workload.runs
        return [workload.replay(run.run_id, run.run_id) for run in runs]

    return load


SOURCES: dict[str, Callable[[int, int | None, Path | None], list[WorkflowProgram]]] = {
    "chatdev": _trace_programs("chatdev"),
    "claude_code": _trace_programs("claude_code"),
    "synthetic:per_task_experts": load_per_task_experts,
}
DEFAULT_GENERATED = 200


def _generated_programs(name: str) -> Callable[[int, int | None, Path | None], list[WorkflowProgram]]:
    def load(seed: int, limit: int | None, data_dir: Path | None) -> list[WorkflowProgram]:
        workload = get_workload(name)
        rng = np.random.default_rng(seed)
        count = limit if limit is not None else DEFAULT_GENERATED
        return [workload.instantiate(rng, f"wf-{i}") for i in range(count)]

    return load


def source(data: str) -> Callable[[int, int | None, Path | None], list[WorkflowProgram]]:
    """The program loader ``--data`` names; ``DataError`` listing the choices otherwise."""
    if data in SOURCES:
        return SOURCES[data]
    if data.startswith(WORKLOAD_PREFIX):
        name = data[len(WORKLOAD_PREFIX) :]
        try:
            return _generated_programs(check_workload_name(name))
        except ValueError as exc:  # an unknown name, or a spec file that does not validate
            raise DataError(f"--data {data!r}: {exc}") from None
    raise DataError(
        f"unknown --data {data!r}: use chatdev, claude_code, synthetic:per_task_experts or workload:<name> "
        "(e.g. workload:coding_assistant)"
    )


def load_workflows(
    data: str,
    *,
    seed: int = 0,
    limit: int | None = None,
    data_dir: Path | None = None,
    concurrency: float = 8.0,
    hash_tokens: int = 4096,
) -> list[Workflow]:
    programs = source(data)(seed, limit, data_dir)
    return timed_workflows(programs, seed=seed, concurrency=concurrency, hash_tokens=hash_tokens)
