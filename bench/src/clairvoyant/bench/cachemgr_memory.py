"""``cachemgr-memory``: what the cache manager holds per live workflow.

    python -m clairvoyant.bench.cachemgr_memory                  # saves bench/results/cachemgr-memory/...
    python -m clairvoyant.bench cachemgr-memory --workflows 100,1000 --workload deep_research

Drives the cache manager's pure core (``CacheManagerCore`` with the ``pythia`` policy) with the
completed calls of ``N`` workflows of a built-in workload, every call of every workflow, none of
them ended, so all ``N`` stay live, each call's blocks reported stored on one of four workers.
Prompts are the simulator's (``PromptBook``: shared system prompts, copied context), outputs are the
workload's lengths.  Reports, per live workflow: the token ids and hashes the history accounts
(``history_bytes``, what ``CV_CACHEMGR_HISTORY_MAX_BYTES`` bounds) and the Python heap the whole
core's own code allocated and still holds (``tracemalloc``, filtered to the core and the policy
package: the index, the history, the policy's state and every object's overhead), and the index's
entries.  Nothing is removed from the index here (no worker evicts), so its entries are every block
the workflows ever stored: an upper bound on what a cluster's bounded tiers would report.  A run with a history budget below the demand shows the
bound at work: whole workflows are evicted and the bytes stay under it.
"""

from __future__ import annotations

import argparse
import random
import sys
import tracemalloc
from typing import Any

import numpy as np

from clairvoyant.bench.common import BENCHMARKS, RESULTS_DIR, BenchResult, progress, run_standalone
from clairvoyant.bench.sim.prompts import PromptBook
from clairvoyant.bench.workloads import get_workload
from clairvoyant.cachemgr.core import CacheManagerCore, CoreConfig
from clairvoyant.core.app_metadata import AppMetadata
from clairvoyant.core.blockhash import BLOCK_TOKENS, sequence_hashes
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.policy import CACHE_POLICIES
from clairvoyant.policy.cache import CompletedCall, WorkerLoad

COLUMNS = [
    "workload", "live workflows", "history budget MiB", "workflows held", "calls",
    "history KiB / workflow", "heap KiB / workflow", "index entries / workflow",
]  # fmt: skip
WORKERS = ("w0", "w1", "w2", "w3")


def fill(workload_name: str, workflows: int, budget_bytes: int, seed: int) -> dict[str, Any]:
    """Feed ``workflows`` workflows' calls to a fresh core; what it holds afterwards."""
    workload = get_workload(workload_name)
    rng = np.random.default_rng(seed)
    programs = [workload.instantiate(rng, f"wf-{i:05d}") for i in range(workflows)]
    book, out_rng = PromptBook(seed), random.Random(seed + 1)
    tracemalloc.start()
    core = CacheManagerCore(CACHE_POLICIES.create("pythia"), CoreConfig(history_max_bytes=budget_bytes))
    for worker in WORKERS:
        core.on_worker_load(WorkerLoad(worker, "m", l1_total=1 << 20, l2_total=1 << 21, has_l3=True), 0.0)
    now, calls, sequence = 0.0, 0, dict.fromkeys(WORKERS, 0)
    stored: set[int] = set()
    for index, program in enumerate(programs):
        worker = WORKERS[index % len(WORKERS)]
        for call in program.calls:
            prompt = book.prompt(program.workflow_type, call)
            output = [out_rng.randrange(256) for _ in range(call.output_tokens)]
            book.record_response(call.call_id, output)
            prompt_blocks, response_blocks = sequence_hashes(prompt, output)
            fresh = tuple(h for h in (*prompt_blocks, *response_blocks) if h not in stored)
            stored.update(fresh)
            sequence[worker] += 1
            event = KvBlockEvent(KvEventKind.STORED, KvTier.L1, "t", fresh, workflow_id=program.workflow_id,
                                 agent_id=call.agent_id, request_id=call.call_id)  # fmt: skip
            now += 0.001
            core.on_kv_batch(KvBatch(worker, "m", BLOCK_TOKENS, sequence[worker], (event,) if fresh else ()), now)
            meta = AppMetadata(program.workflow_type, program.workflow_id, call.agent_id)
            core.on_completion(CompletedCall(
                call.call_id, "t", "m", worker, now - 0.001, now, len(prompt), len(output), app_metadata=meta,
                prompt_block_hashes=tuple(prompt_blocks), response_block_hashes=tuple(response_blocks),
                prompt_token_ids=tuple(prompt), output_token_ids=tuple(output),
            ), now)  # fmt: skip
            calls += 1
    # What the core's own code allocated and still holds (not the driver's prompts and sets).
    held_by_core = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, "*/clairvoyant/cachemgr/core/*"), tracemalloc.Filter(True, "*/clairvoyant/policy/*")]
    )
    heap = sum(stat.size for stat in held_by_core.statistics("filename"))
    tracemalloc.stop()
    stats = core.stats()
    held = max(stats.live_workflows, 1)
    return {
        "calls": calls,
        "workflows_held": stats.live_workflows,
        "history_bytes": stats.history_bytes,
        "heap_bytes": heap,
        "indexed_blocks": stats.indexed_blocks,
        "history_kib_per_workflow": stats.history_bytes / held / 1024,
        "heap_kib_per_workflow": heap / held / 1024,
        "index_entries_per_workflow": stats.indexed_blocks / held,
    }


@BENCHMARKS.register("cachemgr-memory")
class CacheManagerMemory:
    help = "bytes the cache manager holds per live workflow (history, index, policy state)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workload", action="append", help="built-in workload (repeatable; default: "
                            "coding_assistant and deep_research)")  # fmt: skip
        parser.add_argument("--workflows", default="50,200", help="live workflows per run, comma-separated")
        parser.add_argument("--budget-mib", type=float, default=256.0,
                            help="CV_CACHEMGR_HISTORY_MAX_BYTES for the runs, in MiB (default 256)")  # fmt: skip
        parser.add_argument("--tight-budget-mib", type=float, default=8.0,
                            help="one more run of the largest count under this budget, to show eviction")  # fmt: skip
        parser.add_argument("--seed", type=int, default=0)

    def run(self, args: argparse.Namespace) -> BenchResult:
        workloads = args.workload or ["coding_assistant", "deep_research"]
        counts = [int(n) for n in str(args.workflows).split(",")]
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        for name in workloads:
            runs = [(n, args.budget_mib) for n in counts] + [(max(counts), args.tight_budget_mib)]
            for workflows, budget in runs:
                progress(f"{name}: {workflows} workflows, history budget {budget:g} MiB")
                got = fill(name, workflows, int(budget * (1 << 20)), args.seed)
                rows.append([
                    name, workflows, budget, got["workflows_held"], got["calls"],
                    round(got["history_kib_per_workflow"], 1), round(got["heap_kib_per_workflow"], 1),
                    round(got["index_entries_per_workflow"], 1),
                ])  # fmt: skip
                summary[f"{name}/{workflows}/{budget:g}MiB"] = got
        return BenchResult(
            "cachemgr-memory",
            COLUMNS,
            rows,
            summary,
            notes=[
                "history KiB: token ids (4 bytes) and chained block hashes (8 bytes) of every finished call "
                "of the live workflows, as the core accounts them against its budget",
                "heap KiB: the Python heap the core's own code holds (tracemalloc), index and policy state included",
                "the history budget bounds the workflows' token ids and hashes; the agents' static prefixes "
                "(at most 1,024 agents x 2 samples x 8,192 tokens) are counted in history bytes but kept apart",
            ],
            params=vars(args) | {"workload": workloads},
        )


def main(argv: list[str] | None = None) -> int:
    return run_standalone(
        CacheManagerMemory(), argv, prog="python -m clairvoyant.bench.cachemgr_memory", description=__doc__,
        out_dir=RESULTS_DIR / "cachemgr-memory",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
