"""Trace-driven workloads: programs rebuilt from real runs under ``<data dir>`` (see data.py).

``chatdev`` replays the 61 ChatDev runs of ``chatdev_warehouse/calls.csv`` (58 with calls), and
``claude_code`` the 710 Claude Code sessions of ``weka_cc_traces/requests_all.csv``.  Each
``instantiate`` picks one run with the rng and replays its calls: real agents (roles), real input
and output token counts, real gaps between calls as tool latency, and a prompt composition inferred
from the token counts (and, for Claude Code, from the recorded block-hash prefix overlap).
"""

from __future__ import annotations

import csv
import logging
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from clairvoyant.workloads.base import AgentStats, ToolStats, Workload, WorkloadStats
from clairvoyant.workloads.data import require
from clairvoyant.workloads.errors import TraceFormatError
from clairvoyant.workloads.program import CallTemplate, TemplateSegment, WorkflowProgram, materialize

logger = logging.getLogger(__name__)


def _rows(path: str, run_column: str, columns: Sequence[str]) -> list[dict[str, str]]:
    """The CSV's rows, each with ``_where`` ("<file> line N, <run column> X") for error messages.
    ``TraceFormatError`` when the file has no header, the header lacks one of ``columns``, or a
    row's ``run_column`` is blank."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if header is None:
            raise TraceFormatError(f"{path} is empty: expected a header with {', '.join(columns)}")
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceFormatError(f"{path} line 1: the header lacks {', '.join(missing)}")
        rows = []
        for row in reader:
            row["_where"] = f"{path} line {reader.line_num}, {run_column} {row.get(run_column)!r}"
            if not (row.get(run_column) or "").strip():
                raise TraceFormatError(f"{row['_where']}: {run_column} is blank")
            rows.append(row)
    return rows


def _int(row: dict[str, str], column: str, blank: int | None = None) -> int:
    """``row[column]`` as an integer (``blank`` for an empty cell, when given); ``TraceFormatError``
    naming the file, line and run otherwise."""
    value = row.get(column)
    if value is None:
        raise TraceFormatError(f"{row['_where']}: no {column!r} column")
    if value.strip() == "" and blank is not None:
        return blank
    try:
        return int(float(value)) if "." in value else int(value)
    except ValueError:
        raise TraceFormatError(f"{row['_where']}: {column} is {value!r}, expected an integer") from None


def _float(row: dict[str, str], column: str) -> float | None:
    """``row[column]`` as a number, None for an empty cell; ``TraceFormatError`` naming the file,
    line and run for anything else that is not a finite number."""
    value = row.get(column)
    if value is None:
        raise TraceFormatError(f"{row['_where']}: no {column!r} column")
    if value.strip() == "":
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not np.isfinite(number):
        raise TraceFormatError(f"{row['_where']}: {column} is {value!r}, expected a number")
    return number


class _Fallbacks:
    """Counts the rows of one file whose blank cell was replaced by a default, and says so once."""

    def __init__(self, workload: str, path: str) -> None:
        self.workload = workload
        self.path = path
        self.blank: dict[str, int] = defaultdict(int)

    def number(self, row: dict[str, str], column: str, default: float) -> float:
        value = _float(row, column)
        if value is None:
            self.blank[column] += 1
            return default
        return value

    def integer(self, row: dict[str, str], column: str, default: int) -> int:
        if (row.get(column) or "").strip() == "" and column in row:
            self.blank[column] += 1
        return _int(row, column, default)

    def warn(self, rows: int, defaults: Mapping[str, object]) -> None:
        for column, count in sorted(self.blank.items()):
            logger.warning(
                "%s: %d of %d rows of %s have a blank %s; taken as %s",
                self.workload, count, rows, self.path, column, defaults[column],
            )  # fmt: skip


def _no_runs(workload: str, path: Path) -> TraceFormatError:
    return TraceFormatError(f"the {workload} workload: {path} holds no calls (a header only?)")


@dataclass(frozen=True)
class TraceRun:
    run_id: str
    calls: tuple[CallTemplate, ...]


class TraceWorkload(Workload):
    """Replays recorded runs; one run, picked uniformly by the rng, per workflow instance."""

    def __init__(
        self,
        name: str,
        description: str,
        runs: Sequence[TraceRun],
        models: Mapping[str, str],
        max_tool_latency_s: float | None = None,
    ) -> None:
        super().__init__(models)
        if not runs:
            raise ValueError(f"{name}: no runs")
        self.name = name
        self.description = description
        self.runs = tuple(runs)
        self.max_tool_latency_s = max_tool_latency_s  # cap on recorded gaps (humans idle for hours)
        self._index = {run.run_id: i for i, run in enumerate(self.runs)}

    def instantiate(self, rng: np.random.Generator, workflow_id: str) -> WorkflowProgram:
        run = self.runs[int(rng.integers(len(self.runs)))]
        return materialize(self.name, workflow_id, run.calls, self._served, self.max_tool_latency_s)

    def replay(self, run_id: str, workflow_id: str) -> WorkflowProgram:
        """The program of one named run."""
        run = self.runs[self._index[run_id]]
        return materialize(self.name, workflow_id, run.calls, self._served, self.max_tool_latency_s)

    def stats(self) -> WorkloadStats:
        per_agent: dict[str, list[CallTemplate]] = defaultdict(list)
        for run in self.runs:
            for call in run.calls:
                per_agent[call.agent_id].append(call)
        agents: dict[str, AgentStats] = {}
        for agent, calls in sorted(per_agent.items()):
            out = np.array([c.output_tokens for c in calls], dtype=float)
            by_tool: dict[str, list[float]] = defaultdict(list)
            for c in calls:
                if c.tool is not None:
                    cap = self.max_tool_latency_s
                    by_tool[c.tool].append(c.tool_latency_s if cap is None else min(c.tool_latency_s, cap))
            tools = tuple(
                ToolStats(tool, len(lat) / len(calls), float(np.mean(lat)), _cv(np.array(lat)))
                for tool, lat in sorted(by_tool.items())
            )
            models = {c.model for c in calls}
            served = ",".join(sorted({self._served.get(m, m) for m in models}))
            agents[agent] = AgentStats(
                agent, served, len(calls) / len(self.runs), float(out.mean()), _cv(out), tools
            )
        sizes = [len(run.calls) for run in self.runs]
        return WorkloadStats(self.name, float(np.mean(sizes)), max(sizes), agents)


def _cv(values: np.ndarray) -> float:
    mean = float(values.mean())
    return float(values.std()) / mean if mean > 0 else 0.0


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


# ---------------------------------------------------------------------------------------------------
# ChatDev (chatdev_warehouse/calls.csv)

CHATDEV_CALLS = "chatdev_warehouse/calls.csv"
# The role system message shared by every run: ChatDev's company preamble ({chatdev_prompt}) plus the
# role description of RoleConfig.json, about 130 tokens as printed in raw/*.log; the customer's task
# follows it, so everything after is new to each run.
CHATDEV_ROLE_PROMPT_TOKENS = 130
CHATDEV_COLUMNS = (
    "session", "call_idx", "t_rel_s", "latency_s", "prompt_tokens", "completion_tokens",
    "phase_name", "assistant_role", "speaker", "model_type",
)  # fmt: skip
# model_type column -> alias; rows with None or empty use ChatDev's default, GPT_3_5_TURBO.
_CHATDEV_MODEL_TYPES = {"ModelType.GPT_4": "gpt-4"}
CHATDEV_MODELS = {"gpt-3.5-turbo": "llama-3.1-8b", "gpt-4": "llama-3.1-70b"}


def chatdev(data_dir: Path | None = None, max_tool_latency_s: float | None = None) -> TraceWorkload:
    path = require(CHATDEV_CALLS, "the chatdev workload", data_dir)
    runs = load_chatdev_runs(str(path))
    if not runs:
        raise _no_runs("chatdev", path)
    return TraceWorkload(
        "chatdev",
        "ChatDev software-company runs replayed call by call (roles, phases, lengths, gaps).",
        runs,
        CHATDEV_MODELS,
        max_tool_latency_s,
    )


@lru_cache(maxsize=4)
def load_chatdev_runs(path: str) -> tuple[TraceRun, ...]:
    sessions: dict[str, list[dict[str, str]]] = defaultdict(list)
    all_rows = _rows(path, "session", CHATDEV_COLUMNS)
    for row in all_rows:
        sessions[row["session"]].append(row)
    fallbacks = _Fallbacks("chatdev", path)
    runs = []
    for session, rows in sorted(sessions.items()):
        rows.sort(key=lambda r: _int(r, "call_idx"))
        runs.append(TraceRun(session, tuple(_chatdev_calls(rows, fallbacks))))
    fallbacks.warn(len(all_rows), {"t_rel_s": "unknown (no gap)", "latency_s": "unknown (no gap)"})
    return tuple(runs)


def _chatdev_calls(rows: list[dict[str, str]], fallbacks: _Fallbacks) -> list[CallTemplate]:
    calls: list[CallTemplate] = []
    for k, row in enumerate(rows):
        agent = _snake(row["speaker"] or row["assistant_role"] or "chatdev_agent")
        prompt_tokens = max(1, _int(row, "prompt_tokens"))
        prompt: list[TemplateSegment] = []
        before = calls[-1] if calls else None
        # Same phase and the prompt holds the previous prompt + reply: the role-play chat goes on.
        if (
            before
            and rows[k - 1]["phase_name"] == row["phase_name"]
            and (prompt_tokens >= before.prompt_tokens + before.output_tokens)
        ):
            prompt += [
                ("call", k - 1, "prompt", before.prompt_tokens),
                ("call", k - 1, "response", before.output_tokens),
            ]
        else:
            prompt.append(("system", agent, min(CHATDEV_ROLE_PROMPT_TOKENS, prompt_tokens)))
        rest = prompt_tokens - sum(int(seg[-1]) for seg in prompt)
        if rest > 0:
            prompt.append(("new", rest))
        tool, gap = None, 0.0
        if k + 1 < len(rows):
            after = rows[k + 1]
            received, latency = _float(after, "t_rel_s"), _float(after, "latency_s")
            previous_received = _float(row, "t_rel_s")
            if received is None or latency is None or previous_received is None:
                for column, value in (("t_rel_s", received), ("latency_s", latency)):
                    if value is None:
                        fallbacks.blank[column] += 1
            else:
                # t_rel_s is the receive time; send = receive - latency (1-second resolution).
                gap = max(0.0, received - latency - previous_received)
            if gap > 0:
                tool = "executor" if after["phase_name"].startswith("Test") else "framework"
        model = _CHATDEV_MODEL_TYPES.get(row["model_type"], "gpt-3.5-turbo")
        deps = (k - 1,) if k else ()
        calls.append(
            CallTemplate(agent, model, tuple(prompt), max(1, _int(row, "completion_tokens")), deps, tool, gap)
        )
    return calls


# ---------------------------------------------------------------------------------------------------
# Claude Code (weka_cc_traces/requests_all.csv + traces_summary.csv)

WEKA_CALLS = "weka_cc_traces/requests_all.csv"
WEKA_SUMMARY = "weka_cc_traces/traces_summary.csv"
WEKA_BLOCK_TOKENS = 64  # block_size of the hash_ids (raw/trace_*.json)
# Sub-agents (Explore, Plan, general-purpose) have their own system prompt and tool list; in the
# sub-agent entries of raw/trace_*.json tool_tokens is 7401-7771 and system_tokens 733-2304, mostly
# 7401 + ~1015, so ~8400 tokens.  The main agent's come per session from traces_summary.csv.
WEKA_SUBAGENT_SYSTEM_TOKENS = 8_400
WEKA_COLUMNS = (
    "trace_id", "agent_id", "agent_type", "seq", "t_abs_s", "in_tokens", "out_tokens",
    "think_time_s", "api_time_s", "model", "input_types", "lcp_prev_blocks",
)  # fmt: skip
WEKA_SUMMARY_COLUMNS = ("trace_id", "tool_tokens", "system_tokens")
CLAUDE_MODELS = {
    "claude-opus": "llama-3.1-70b",
    "claude-sonnet": "llama-3.1-70b",
    "claude-haiku": "llama-3.1-8b",
}


def claude_code(data_dir: Path | None = None, max_tool_latency_s: float | None = None) -> TraceWorkload:
    calls = require(WEKA_CALLS, "the claude_code workload", data_dir)
    summary = require(WEKA_SUMMARY, "the claude_code workload", data_dir)
    runs = load_claude_code_runs(str(calls), str(summary))
    if not runs:
        raise _no_runs("claude_code", calls)
    return TraceWorkload(
        "claude_code",
        "Claude Code sessions replayed call by call (main agent + sub-agents, think time, prefix reuse).",
        runs,
        CLAUDE_MODELS,
        max_tool_latency_s,
    )


def _claude_alias(model: str) -> str:
    match = re.match(r"claude-(opus|sonnet|haiku)", model)
    return match.group(0) if match else model


@lru_cache(maxsize=4)
def load_claude_code_runs(calls_path: str, summary_path: str) -> tuple[TraceRun, ...]:
    system: dict[str, int] = {}
    summary = _rows(summary_path, "trace_id", WEKA_SUMMARY_COLUMNS)
    summary_fallbacks = _Fallbacks("claude_code", summary_path)
    for row in summary:
        system_tokens = summary_fallbacks.integer(row, "system_tokens", 0)
        system[row["trace_id"]] = system_tokens + summary_fallbacks.integer(row, "tool_tokens", 0)
    summary_fallbacks.warn(len(summary), {"system_tokens": 0, "tool_tokens": 0})
    traces: dict[str, list[dict[str, str]]] = defaultdict(list)
    all_rows = _rows(calls_path, "trace_id", WEKA_COLUMNS)
    for row in all_rows:
        _float(row, "think_time_s"), _float(row, "api_time_s")  # garbage fails even where unused
        traces[row["trace_id"]].append(row)
    missing = sorted(set(traces) - set(system))
    if missing:
        logger.warning(
            "claude_code: %d of %d sessions have no row in %s (e.g. %s); their main agent gets %d system tokens",
            len(missing), len(traces), summary_path, missing[0], WEKA_SUBAGENT_SYSTEM_TOKENS,
        )  # fmt: skip
    fallbacks = _Fallbacks("claude_code", calls_path)
    runs = tuple(
        TraceRun(
            trace_id, tuple(_claude_calls(rows, system.get(trace_id, WEKA_SUBAGENT_SYSTEM_TOKENS), fallbacks))
        )
        for trace_id, rows in sorted(traces.items())
    )
    fallbacks.warn(len(all_rows), {"think_time_s": "0 s", "api_time_s": "0 s"})
    return runs


def _claude_calls(
    rows: list[dict[str, str]], main_system_tokens: int, fallbacks: _Fallbacks
) -> list[CallTemplate]:
    """One session.  Each agent stream (main, or one sub-agent) is a chain; a sub-agent starts from
    the last main call issued before it, and the first main call issued after the sub-agent's last
    call ended (1 s slack: the trace has 1 s resolution) joins it."""
    streams: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        streams[row["agent_id"]].append(row)
    position: dict[tuple[str, int], int] = {}
    for agent_id, stream in streams.items():
        stream.sort(key=lambda r: _int(r, "seq"))
        for i, r in enumerate(stream):
            if (agent_id, _int(r, "seq")) in position:
                raise TraceFormatError(f"{r['_where']}: agent {agent_id!r} has seq {r['seq']} twice")
            position[(agent_id, _int(r, "seq"))] = i
    # Emission order: by start time, main before a sub-agent starting in the same second.
    order = sorted((_start(r), r["agent_id"] != "main", _int(r, "seq"), r["agent_id"]) for r in rows)
    calls: list[CallTemplate] = []
    last_in_stream: dict[str, int] = {}  # agent_id -> index of its latest emitted call
    last_main: int | None = None
    sub_ends: list[tuple[float, int]] = []  # (end time, index) of finished sub-agents not joined yet
    for t, is_sub, seq, agent_id in order:
        stream = streams[agent_id]
        at = position[(agent_id, seq)]
        row = stream[at]
        prev_index = last_in_stream.get(agent_id)
        deps: list[int] = [prev_index] if prev_index is not None else []
        if is_sub and prev_index is None and last_main is not None:
            deps.append(last_main)
        if not is_sub and prev_index is not None:
            joined = [(end, i) for end, i in sub_ends if end <= t + 1.0]
            deps += [i for _, i in joined]
            sub_ends = [item for item in sub_ends if item not in joined]
        agent = (_snake(row["agent_type"]) or "subagent") if is_sub else "main"
        system = WEKA_SUBAGENT_SYSTEM_TOKENS if is_sub else main_system_tokens
        prev = calls[prev_index] if prev_index is not None else None
        prompt = _claude_prompt(row, prev, prev_index, agent, system)
        tool, gap = None, 0.0
        if at + 1 < len(stream):
            after = stream[at + 1]
            gap = fallbacks.number(after, "think_time_s", 0.0)
            tool = "user" if after["input_types"] == "text" else "tool"
        here = len(calls)
        calls.append(
            CallTemplate(
                agent,
                _claude_alias(row["model"]),
                prompt,
                max(1, _int(row, "out_tokens")),
                tuple(deps),
                tool,
                gap,
            )
        )
        last_in_stream[agent_id] = here
        if is_sub and at == len(stream) - 1:
            sub_ends.append((t + fallbacks.number(row, "api_time_s", 0.0), here))
        if not is_sub:
            last_main = here
    return calls


def _start(row: dict[str, str]) -> float:
    start = _float(row, "t_abs_s")
    if start is None:
        raise TraceFormatError(f"{row['_where']}: t_abs_s is blank, expected a number")
    return start


def _claude_prompt(
    row: dict[str, str], prev: CallTemplate | None, prev_index: int | None, agent: str, system_tokens: int
) -> tuple[TemplateSegment, ...]:
    tokens = max(1, _int(row, "in_tokens"))
    prompt: list[TemplateSegment] = []
    reused = _int(row, "lcp_prev_blocks", 0) * WEKA_BLOCK_TOKENS
    if prev is not None and prev_index is not None and reused > 0:
        before = prev.prompt_tokens
        if tokens >= before and reused >= before - WEKA_BLOCK_TOKENS:
            # The whole previous prompt is a prefix (hashes cover whole blocks only); the previous
            # reply follows it, then the tool result or user turn.
            prompt.append(("call", prev_index, "prompt", before))
            reply = min(prev.output_tokens, tokens - before)
            if reply > 0:
                prompt.append(("call", prev_index, "response", reply))
        else:
            prompt.append(("call", prev_index, "prompt", min(reused, tokens, before)))
    else:
        prompt.append(("system", agent, min(system_tokens, tokens)))
    rest = tokens - sum(int(seg[-1]) for seg in prompt)
    if rest > 0:
        prompt.append(("new", rest))
    return tuple(prompt)
