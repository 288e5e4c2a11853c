"""Synthetic workflow types for traffic the trace data sets lack, and a comparison of naming modes.

``per_task_experts``: planner -> expert_<k> -> reviewer, with k drawn Zipf-like (weight 1/k^s)
from ``EXPERTS`` names, as agent frameworks that name an agent per task produce: a few experts
recur, most are seen once or never before.  Each expert belongs to one of ``FAMILIES`` (its system
prompt, model and output lengths), which its name does not tell; an expert's lengths are log-normal
around its family's median, shifted by a fixed per-expert factor.  Programs only (``WorkflowProgram``);
``data.timed_workflows`` times them and hashes their prompts.

    python -m clairvoyant.profiler.evaluation.synthetic [--workflows 400] [--seed 0]

replays the workflow type under each naming mode (``MODES``) and prints length coverage and width.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from clairvoyant.profiler.core.agent_names import AgentNameConfig
from clairvoyant.profiler.core.priors import PriorConfig
from clairvoyant.profiler.core.profile_types import ProfileConfig
from clairvoyant.workloads import Call, CallSegment, NewSegment, SystemSegment, WorkflowProgram

if TYPE_CHECKING:  # data.py lists this module's loader among its sources: no import at run time
    from clairvoyant.profiler.evaluation.data import Workflow

WORKFLOW_TYPE = "per_task_experts"
EXPERTS = 150
ZIPF_EXPONENT = 1.0
EXPERT_SPREAD = 0.25  # sigma of the fixed log-factor that sets an expert apart from its family
DEFAULT_WORKFLOWS = 400
PROMPT_PREFIX_BLOCKS = 4  # 64 tokens: inside every system prompt below


class Family(NamedTuple):
    system_prompt: str  # the SystemSegment key: one system prompt per family
    model: str
    median_tokens: float
    sigma: float  # of log(output tokens)


FAMILIES = (
    Family("expert/brief", "small", 120.0, 0.35),
    Family("expert/code", "coder", 700.0, 0.45),
    Family("expert/report", "small", 320.0, 0.4),
)
PLANNER = Family("planner", "large", 200.0, 0.3)
REVIEWER = Family("reviewer", "large", 150.0, 0.3)


def expert_family(k: int) -> Family:
    return FAMILIES[k % len(FAMILIES)]


def expert_factor(k: int) -> float:
    """The fixed factor by which expert ``k``'s lengths differ from its family's (same for every seed)."""
    return float(np.exp(np.random.default_rng([k, 7]).normal(0.0, EXPERT_SPREAD)))


def _tokens(rng: np.random.Generator, family: Family, factor: float = 1.0) -> int:
    return max(1, int(round(family.median_tokens * factor * float(np.exp(rng.normal(0.0, family.sigma))))))


def per_task_expert_programs(
    count: int, *, seed: int, experts: int = EXPERTS, exponent: float = ZIPF_EXPONENT
) -> list[WorkflowProgram]:
    """``count`` workflows of the per_task_experts type (module doc), reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, experts + 1) ** exponent
    picks = rng.choice(experts, size=count, p=weights / weights.sum()) + 1
    return [_program(f"wf-{i}", int(k), rng) for i, k in enumerate(picks)]


def _program(workflow_id: str, k: int, rng: np.random.Generator) -> WorkflowProgram:
    family = expert_family(k)
    ids = [f"{workflow_id}/{i}" for i in range(3)]
    plan = _tokens(rng, PLANNER)
    work = _tokens(rng, family, expert_factor(k))
    review = _tokens(rng, REVIEWER)
    planner = Call(
        ids[0], 0, "planner", PLANNER.model,
        (SystemSegment("system", PLANNER.system_prompt, 384), NewSegment("new", 200)),
        584, plan, (),
    )  # fmt: skip
    expert = Call(
        ids[1], 1, f"expert_{k}", family.model,
        (SystemSegment("system", family.system_prompt, 256), NewSegment("new", 48),
         CallSegment("call", ids[0], "response", plan)),
        304 + plan, work, (ids[0],),
    )  # fmt: skip
    reviewer = Call(
        ids[2], 2, "reviewer", REVIEWER.model,
        (SystemSegment("system", REVIEWER.system_prompt, 320), CallSegment("call", ids[1], "response", work)),
        320 + work, review, (ids[1],),
    )  # fmt: skip
    return WorkflowProgram(WORKFLOW_TYPE, workflow_id, (planner, expert, reviewer))


def load_per_task_experts(seed: int, limit: int | None, data_dir: Path | None) -> list[WorkflowProgram]:
    """The loader ``data.SOURCES`` takes (``data_dir`` is unused: nothing is read)."""
    del data_dir
    return per_task_expert_programs(limit if limit is not None else DEFAULT_WORKFLOWS, seed=seed)


# ------------------------------------------------------------------------ naming modes compared

MODES: dict[str, ProfileConfig] = {
    "off": ProfileConfig(priors=PriorConfig(enabled=False)),
    "prior": ProfileConfig(),
    "pattern": ProfileConfig(agent_names=AgentNameConfig(pattern=r"\d+")),
    "prompt_hash": ProfileConfig(agent_names=AgentNameConfig(prompt_prefix_blocks=PROMPT_PREFIX_BLOCKS)),
}


class ModeResult(NamedTuple):
    """One naming mode's replay (``replay.py`` defines the metrics)."""

    coverage: float  # length_interval_coverage
    width_ratio: float  # length_interval_width_ratio
    agents: int  # agents the profile ended with
    annotate_p99_ms: float  # wall clock, in process
    ingest_records_per_s: float


def compare(
    workflows: Sequence[Workflow], holdout: float = 0.3, modes: Mapping[str, ProfileConfig] = MODES
) -> dict[str, ModeResult]:
    """Replay ``workflows`` once per mode."""
    from clairvoyant.profiler.evaluation.replay import replay  # imports data.py (see above)

    results = {}
    for mode, config in modes.items():
        report = replay(workflows, holdout, config)
        results[mode] = ModeResult(
            coverage=report["length_interval_coverage"],
            width_ratio=report["length_interval_width_ratio"],
            agents=report["agents"],
            annotate_p99_ms=report["annotate_p99_ms"],
            ingest_records_per_s=report["ingest_records_per_s"],
        )
    return results


def with_models(workflows: Sequence[Workflow], programs: Sequence[WorkflowProgram]) -> list[Workflow]:
    """``workflows`` with each record's ``model`` set from its program's call."""
    models = {c.call_id: c.model for p in programs for c in p.calls}
    return [
        replace(w, records=tuple(replace(r, model=models[r.request_id]) for r in w.records))
        for w in workflows
    ]


def main(argv: list[str]) -> int:
    from clairvoyant.profiler.evaluation.data import timed_workflows  # see the import above

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=DEFAULT_WORKFLOWS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--holdout", type=float, default=0.3)
    args = parser.parse_args(argv)
    programs = per_task_expert_programs(args.workflows, seed=args.seed)
    workflows = with_models(timed_workflows(programs, seed=args.seed, concurrency=8.0, hash_tokens=512), programs)
    print(f"{'mode':<12} {'coverage':>9} {'width':>7} {'agents':>7} {'annotate p99 ms':>16} {'records/s':>10}")
    for mode, row in compare(workflows, args.holdout).items():
        print(
            f"{mode:<12} {row.coverage:>9.4f} {row.width_ratio:>7.3f} {row.agents:>7} "
            f"{row.annotate_p99_ms:>16.3f} {row.ingest_records_per_s:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
