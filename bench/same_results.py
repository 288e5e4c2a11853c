"""Do two result files of ``python -m clairvoyant.bench run|compare|sweep`` hold the same results?

Everything must be equal except what the wall clock sets (``wall_seconds`` at any depth): the
simulator is deterministic, so a refactor that changes no decision leaves every number, ordering
and record as it was.  Exit status 0 when identical, 1 with the first differences otherwise.

    .venv/bin/python -m clairvoyant.bench compare --workload coding_assistant \\
        --policies fcfs-rr,vllm-prodstack,sglang-gw,autellix,kairos,saga,pythia,clairvoyant \\
        --gpus 8 --workflows 64 --concurrency 64 --annotations profiler --seed 0 --out before.json
    # ... change the code, run the same command with --out after.json, then:
    .venv/bin/python bench/same_results.py before.json after.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

WALL_CLOCK_KEYS = frozenset({"wall_seconds"})


def without_wall_clock(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def differences(before: Any, after: Any, path: str = "") -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = [f"{path}.{k}: only in one file" for k in sorted(set(before) ^ set(after))]
        for key in sorted(set(before) & set(after)):
            found += differences(before[key], after[key], f"{path}.{key}")
        return found
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [f"{path}: {len(before)} items vs {len(after)}"]
        return [d for i, (b, a) in enumerate(zip(before, after, strict=True)) for d in differences(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before!r} vs {after!r}"]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = (without_wall_clock(json.loads(Path(name).read_text())) for name in argv)
    found = differences(before, after)
    if found:
        print(f"{len(found)} differences; the first:", *found[:20], sep="\n  ")
        return 1
    same = json.dumps(before, sort_keys=True) == json.dumps(after, sort_keys=True)
    print(f"identical apart from wall-clock fields ({'byte for byte' if same else 'by value'})")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
