"""Rebuild ``requests_all.csv`` and ``traces_summary.csv`` from raw Claude Code session traces.

    python -m clairvoyant.bench.weka_extract RAW_DIR OUT_DIR

RAW_DIR holds ``*.json`` traces in the format of kv-cache-tester's ``traces/`` (``{id, block_size,
tool_tokens, system_tokens, requests: [...]}``; a request is an LLM call, ``type`` ``n`` or ``s``,
or a ``subagent`` entry whose own ``requests`` ran ``t`` seconds after its parent's start).  OUT_DIR
gets the two CSVs the ``claude_code`` workload and ``python -m clairvoyant.profiler evaluate --data
claude_code`` read (``weka_cc_traces/`` under the data directory).  For the raw traces shipped in
``weka_cc_traces/raw`` the rows equal the shipped ones byte for byte; how each column is derived is
written in ``docs/profiler.md`` ("Your own Claude Code traces").

Contract: a file that is not JSON, or lacks a field the columns need, raises ``TraceFormatError``
naming the file and the request (``requests[3].requests[0]``); nothing is written then.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from clairvoyant.workloads.errors import TraceFormatError

CALLS_FILE = "requests_all.csv"
SUMMARY_FILE = "traces_summary.csv"
CALL_COLUMNS = (
    "trace_id", "agent_id", "agent_type", "depth", "seq", "t_abs_s", "in_tokens", "out_tokens",
    "n_blocks", "think_time_s", "api_time_s", "stop", "model", "input_types", "lcp_prev_blocks",
    "inf_hit_blocks",
)  # fmt: skip
SUMMARY_COLUMNS = (
    "trace_id", "path", "bytes", "n_calls", "n_main_calls", "n_subagents", "n_sub_calls",
    "duration_s", "tool_tokens", "system_tokens", "models",
)  # fmt: skip
MAIN_AGENT = "main"
TRACE_PATH_PREFIX = "traces/"  # the summary's ``path``: where kv-cache-tester keeps the files


class CallRow(NamedTuple):
    """One LLM call: a row of ``requests_all.csv``."""

    trace_id: str
    agent_id: str  # "main" or the sub-agent's agent_id
    agent_type: str  # "main" or the sub-agent's subagent_type
    depth: int  # 0 for the main agent, 1 for a sub-agent it started, ...
    seq: int  # index of the call within its agent
    t_abs_s: float  # start, seconds since the session's first call
    in_tokens: int
    out_tokens: int
    n_blocks: int  # len(hash_ids)
    think_time_s: float | None  # None where the trace lacks it
    api_time_s: float | None
    stop: str
    model: str
    input_types: tuple[str, ...]  # sorted
    lcp_prev_blocks: int  # common hash_ids prefix with the same agent's previous call
    inf_hit_blocks: int  # leading hash_ids already sent by any earlier call (an unbounded prefix cache)

    def cells(self) -> list[str]:
        return [
            self.trace_id, self.agent_id, self.agent_type, str(self.depth), str(self.seq),
            f"{self.t_abs_s:.3f}", str(self.in_tokens), str(self.out_tokens), str(self.n_blocks),
            _optional(self.think_time_s), _optional(self.api_time_s), self.stop, self.model,
            "|".join(self.input_types), str(self.lcp_prev_blocks), str(self.inf_hit_blocks),
        ]  # fmt: skip


class TraceSummary(NamedTuple):
    """One session: a row of ``traces_summary.csv``."""

    trace_id: str
    path: str  # TRACE_PATH_PREFIX + file name
    bytes: int  # size of the raw file
    n_calls: int
    n_main_calls: int
    n_subagents: int  # subagent entries at any depth
    n_sub_calls: int
    duration_s: float  # latest call start (t_abs_s), not its end
    tool_tokens: int
    system_tokens: int
    models: tuple[str, ...]  # sorted models of the main agent's calls

    def cells(self) -> list[str]:
        return [
            self.trace_id, self.path, str(self.bytes), str(self.n_calls), str(self.n_main_calls),
            str(self.n_subagents), str(self.n_sub_calls), f"{self.duration_s:.1f}",
            str(self.tool_tokens), str(self.system_tokens), "|".join(self.models),
        ]  # fmt: skip


class ExtractedTrace(NamedTuple):
    calls: list[CallRow]  # in file order: a sub-agent's calls where its entry stands
    summary: TraceSummary


def _optional(value: float | None) -> str:
    return "" if value is None else repr(value)


class _Field:
    """Typed access to one JSON object, raising ``TraceFormatError`` that names file and place."""

    def __init__(self, entry: Any, path: Path, where: str) -> None:
        if not isinstance(entry, dict):
            raise TraceFormatError(f"{path}: {where} is not an object")
        self.entry, self.path, self.where = entry, path, where

    def get(self, name: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
        if name not in self.entry or self.entry[name] is None:
            if required:
                raise TraceFormatError(f"{self.path}: {self.where} lacks the field {name!r}")
            return None
        value = self.entry[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise TraceFormatError(f"{self.path}: {self.where}.{name} is {value!r}, expected {_kind_name(kind)}")
        return value

    def number(self, name: str, required: bool = True) -> float | None:
        value = self.get(name, (int, float), required)
        return None if value is None else float(value)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):  # stops at the shorter
        if x != y:
            break
        n += 1
    return n


class _TraceWalk:
    """Depth-first over the nested requests, in file order, with the blocks seen so far."""

    def __init__(self, trace_id: str, path: Path) -> None:
        self.trace_id, self.path = trace_id, path
        self.calls: list[CallRow] = []
        self.seen_blocks: set[object] = set()
        self.n_subagents = 0

    def agent(self, requests: Any, where: str, agent_id: str, agent_type: str, depth: int, start: float) -> None:
        if not isinstance(requests, list):
            raise TraceFormatError(f"{self.path}: {where}.requests is not a list")
        previous_blocks: list[object] | None = None
        seq = 0
        for i, entry in enumerate(requests):
            at = f"{where}.requests[{i}]" if where else f"requests[{i}]"
            field = _Field(entry, self.path, at)
            t = start + (field.number("t") or 0.0)
            if field.get("type", str) == "subagent":
                self.n_subagents += 1
                sub_id, sub_type = field.get("agent_id", str), field.get("subagent_type", str)
                self.agent(field.get("requests", list), at, sub_id, sub_type, depth + 1, t)
                continue
            blocks = field.get("hash_ids", list)
            if not all(isinstance(block, (int, str)) for block in blocks):
                raise TraceFormatError(f"{self.path}: {at}.hash_ids holds a value that is not a block hash")
            self.calls.append(
                CallRow(
                    trace_id=self.trace_id,
                    agent_id=agent_id,
                    agent_type=agent_type,
                    depth=depth,
                    seq=seq,
                    t_abs_s=t,
                    in_tokens=field.get("in", int),
                    out_tokens=field.get("out", int),
                    n_blocks=len(blocks),
                    think_time_s=field.number("think_time", required=False),
                    api_time_s=field.number("api_time", required=False),
                    stop=field.get("stop", str, required=False) or "",
                    model=field.get("model", str),
                    input_types=tuple(sorted(field.get("input_types", list))),
                    lcp_prev_blocks=_common_prefix(previous_blocks, blocks) if previous_blocks is not None else 0,
                    inf_hit_blocks=self._cached_prefix(blocks),
                )
            )
            previous_blocks = blocks
            seq += 1

    def _cached_prefix(self, blocks: list[object]) -> int:
        hits = 0
        for block in blocks:
            if block not in self.seen_blocks:
                break
            hits += 1
        self.seen_blocks.update(blocks)
        return hits


def extract_trace(path: Path) -> ExtractedTrace:
    """The rows of one raw trace file."""
    try:
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc})") from exc
    top = _Field(trace, path, "the trace")
    walk = _TraceWalk(top.get("id", str), path)
    walk.agent(top.get("requests", list), "", MAIN_AGENT, MAIN_AGENT, 0, 0.0)
    main_calls = [call for call in walk.calls if call.depth == 0]
    summary = TraceSummary(
        trace_id=walk.trace_id,
        path=TRACE_PATH_PREFIX + path.name,
        bytes=path.stat().st_size,
        n_calls=len(walk.calls),
        n_main_calls=len(main_calls),
        n_subagents=walk.n_subagents,
        n_sub_calls=len(walk.calls) - len(main_calls),
        duration_s=max((call.t_abs_s for call in walk.calls), default=0.0),
        tool_tokens=top.get("tool_tokens", int),
        system_tokens=top.get("system_tokens", int),
        models=tuple(sorted({call.model for call in main_calls})),
    )
    return ExtractedTrace(walk.calls, summary)


def extract_dir(raw_dir: Path, out_dir: Path, progress_every: int = 50, log: TextIO | None = None) -> int:
    """Write both CSVs for every ``*.json`` in ``raw_dir`` (sorted by name); returns the number of
    traces.  The CSVs appear only once every file has been read."""
    files = sorted(p for p in raw_dir.glob("*.json") if p.is_file())
    if not files:
        raise TraceFormatError(f"{raw_dir} holds no *.json trace files")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = {name: out_dir / f".{name}.partial" for name in (CALLS_FILE, SUMMARY_FILE)}
    try:
        with open(partial[CALLS_FILE], "w", newline="") as calls_f, open(partial[SUMMARY_FILE], "w", newline="") as summary_f:
            calls_csv, summary_csv = csv.writer(calls_f), csv.writer(summary_f)
            calls_csv.writerow(CALL_COLUMNS)
            summary_csv.writerow(SUMMARY_COLUMNS)
            for done, path in enumerate(files, start=1):
                extracted = extract_trace(path)
                calls_csv.writerows(call.cells() for call in extracted.calls)
                summary_csv.writerow(extracted.summary.cells())
                if log is not None and (done % progress_every == 0 or done == len(files)):
                    print(f"weka_extract: {done}/{len(files)} traces", file=log, flush=True)
        for name, tmp in partial.items():
            os.replace(tmp, out_dir / name)
    finally:
        for tmp in partial.values():
            tmp.unlink(missing_ok=True)
    return len(files)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m clairvoyant.bench.weka_extract",
        description=f"Write {CALLS_FILE} and {SUMMARY_FILE} from raw Claude Code traces (kv-cache-tester format).",
    )
    parser.add_argument("raw_dir", type=Path, metavar="RAW_DIR", help="directory of *.json traces")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="where the two CSVs go")
    parser.add_argument("--progress-every", type=int, default=50, metavar="N", help="a progress line every N files")
    args = parser.parse_args(argv)
    if not args.raw_dir.is_dir():
        parser.error(f"{args.raw_dir} is not a directory")
    if args.progress_every < 1:
        parser.error("--progress-every must be >= 1")
    try:
        n = extract_dir(args.raw_dir, args.out_dir, args.progress_every, log=sys.stderr)
    except (TraceFormatError, OSError) as exc:
        print(f"weka_extract: error: {exc}", file=sys.stderr)
        return 1
    print(f"weka_extract: wrote {n} traces to {args.out_dir / CALLS_FILE} and {args.out_dir / SUMMARY_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
