"""``run`` and ``compare``: policies on a workload, in the simulator (``--mode sim``) or against a
running stack through its gateway (``--mode live``, the policy the stack's scheduler runs).

    python -m clairvoyant.bench run --workload coding_assistant --policy fcfs-rr --gpus 8 \\
        --workflows 64 --concurrency 32 --seed 0 --out run.json
    python -m clairvoyant.bench compare --workload swe_agent --policies fcfs-rr,least-loaded \\
        --rate 0.5 --out compare.json
    python -m clairvoyant.bench compare --workload react_bfcl --policies fcfs-rr,pythia \\
        --arrivals bursty:rate=0.5,cv=4 --jobs 2 --out bursty.json  # any arrival process; 2 at once
    python -m clairvoyant.bench run --mode live --workload react_bfcl --policy fcfs-rr --gpus 2 \\
        --workflows 16 --concurrency 8 --base-url http://127.0.0.1:8000/v1 --out live.json
    python -m clairvoyant.bench compare --workload qa_router+report_generate+code_generate ...  # served together
    python -m clairvoyant.bench compare --workload deep_research --scalings pythia,static,reactive,predictive \
        --policies pythia --gpus 4 --gpu-budget 4 --concurrency 32 --out scale.json  # one preset, scaling varies
    python -m clairvoyant.bench merge part-a.json part-b.json --out compare.json  # same config, more presets
    python -m clairvoyant.bench matrix-report bench/results/matrix-*.json --plots docs/img
    python -m clairvoyant.bench --list
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from clairvoyant.bench import (
    cache_policies,  # noqa: F401  (registers the cache policies benchmark)
    scenarios,
)
from clairvoyant.bench.arrivals import parse_arrivals
from clairvoyant.bench.common import RunBars, progress
from clairvoyant.bench.experiment import (
    ANNOTATORS,
    DEFAULT_LEFT_OUT,
    L3_KINDS,
    PLACEMENTS,
    SCALING_KEYS,
    TIER_KEYS,
    ExperimentConfig,
    check_scaling,
    check_tiers,
    compare,
    scale_compare,
    tiers_on,
    warmup_warning,
)
from clairvoyant.bench.live import validate  # noqa: F401  (registers the sim-vs-live benchmark)
from clairvoyant.bench.live.cluster import LiveModeError
from clairvoyant.bench.live.run import DEFAULT_BASE_URL, DEFAULT_SCHEDULER, LiveOptions, compare_live
from clairvoyant.bench.parallel import default_jobs
from clairvoyant.bench.workloads import WorkloadDataError, check_workload_name, list_workloads
from clairvoyant.policy import PRESETS, SCALING_POLICIES
from clairvoyant.policy.cache import CACHE_POLICIES
from clairvoyant.policy.capabilities import Capability, capabilities_of
from clairvoyant.policy.scheduling import ROUTING_POLICIES
from clairvoyant.worker.core.tiers import WRITE_POLICIES

COMMANDS = ("run", "compare", "merge", "matrix-report", "scenarios")
BASELINE = "vllm-prodstack"  # what the matrix report's ratios are against
SHOWN = ("avg_jct_s", "p95_jct_s", "throughput_tok_s", "avg_queue_s", "cache_hit_ratio", "preemptions",
         "distance_from_limit", "virtual_seconds", "wall_seconds")
SCALE_PRESET = "pythia"  # compare --scalings: the scheduling preset when --policies is not given


def listing() -> str:
    return "workloads: " + ", ".join(list_workloads()) + "\npolicies:  " + ", ".join(PRESETS.names())


def workload_name(name: str) -> str:
    """A registered workload, registered ones joined by ``+`` (served together on one cluster), or a
    spec file (``path/to/spec.yaml``), validated before anything runs."""
    try:
        return check_workload_name(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parsers(commands: Any) -> None:
    for name, help_text in (("run", "one policy on a workload"), ("compare", "several policies, same instance")):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--workload", required=name == "run", type=workload_name,
                         help="a workload name, names joined by + to serve them together, or a spec file"
                              + (" (or --scenario)" if name == "compare" else ""))  # fmt: skip
        if name == "run":
            sub.add_argument("--policy", required=True, choices=PRESETS.names())
        else:
            sub.add_argument("--policies", help="comma-separated: " + ",".join(PRESETS.names())
                             + f"; with --scalings, one preset (default {SCALE_PRESET})")  # fmt: skip
            sub.add_argument("--scalings", metavar="NAMES",
                             help="sim: comma-separated scaling policies, each run with the one scheduling "
                                  "preset; the file's entries are named by scaling policy")  # fmt: skip
            sub.add_argument("--jobs", type=int, default=None,
                             help="sim: policies simulated at once, one process each (default: one per CPU); "
                                  "results do not depend on it")  # fmt: skip
        sub.add_argument("--mode", choices=["sim", "live"], default="sim",
                         help="sim: the simulator; live: the stack behind --base-url (one policy: the one it runs)")
        sub.add_argument("--gpus", type=int, default=8)
        sub.add_argument("--gpu", default="H100-80G")
        sub.add_argument("--workflows", type=int, default=64)
        load = sub.add_mutually_exclusive_group()
        load.add_argument("--rate", type=float, help="Poisson workflow arrivals per second")
        load.add_argument("--concurrency", type=int, help="closed loop: workflows in flight")
        load.add_argument("--arrivals", metavar="SPEC",
                          help="an open-loop arrival process, e.g. bursty:rate=0.5,cv=4 or cron:period_s=60,batch=32 "
                               "or azure_replay:kind=code,scale=20; join several with + (docs/workloads.md)")  # fmt: skip
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument("--block-size", type=int, default=16,
                         help="sim: KV block size in tokens (16 as live workers; 64 runs ~2.5x faster, "
                              "prefix hits rounded to 64 tokens)")  # fmt: skip
        sub.add_argument("--max-num-seqs", type=int, default=256,
                         help="sim: sequences each engine runs at once (vLLM's max_num_seqs); the rest wait "
                              "in the global queue, where the preset's priority orders them")  # fmt: skip
        sub.add_argument("--knee-fraction", type=float, default=None, metavar="PHI",
                         help="sim: for a preset that admits at the knee (clairvoyant, pythia-knee), the "
                              "share of an engine's decode-throughput ceiling its admitted batch reaches, in (0, 1] "
                              "(default: the preset's, 0.7; docs/scheduling.md)")  # fmt: skip
        sub.add_argument("--knee-displace", action="store_true",
                         help="sim: with such a preset, a call more urgent than a worker's least urgent placement "
                              "may be placed beyond the knee, the engine preempting for it")  # fmt: skip
        sub.add_argument("--annotations", choices=list(ANNOTATORS), default="none",
                         help="sim: what annotates each call: nothing, the profiler core (trained on a warm-up "
                              "instance, then online; profiler-path: without its remaining-work model) or the "
                              "generator's ground truth")  # fmt: skip
        sub.add_argument("--warmup-workflows", type=int, default=64,
                         help="sim, --annotations profiler: workflows in the warm-up instance (0: none)")
        scaling = sub.add_argument_group("autoscaling (sim)")
        scaling.add_argument("--scaling", metavar="NAME",
                             help="a scaling policy ticking in virtual time (registered: "
                                  + ", ".join(SCALING_POLICIES.names()) + "); default: fixed replicas")  # fmt: skip
        scaling.add_argument("--gpu-budget", type=int, metavar="GPUS",
                             help="with scaling: GPUs the replicas may hold at once (default: --gpus); "
                                  "the run starts from --gpus' fixed placement trimmed to it")  # fmt: skip
        scaling.add_argument("--scale-interval", type=float, default=5.0, metavar="S",
                             help="with scaling: virtual seconds between the policy's ticks")
        add_tier_arguments(sub.add_argument_group("KV tiers (sim)"))
        sub.add_argument("--placement", choices=list(PLACEMENTS), default="equal",
                         help="sim: equal (each model an equal share of --gpus) or auto (replicas and TP degree "
                              "per model in proportion to the workload's predicted work)")  # fmt: skip
        sub.add_argument("--own-stacks", action="store_true",
                         help="sim: each preset with its own cache and scaling policies, as its paper ran it "
                              "(give the tiers, e.g. --host-cache auto --l3 memory, for the cache policies to act on)")  # fmt: skip
        sub.add_argument("--out", type=Path, required=True, help="results JSON")
        live = sub.add_argument_group("live mode")
        live.add_argument("--base-url", default=DEFAULT_BASE_URL, help="the gateway's OpenAI API")
        live.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"),
                          help="the gateway key (default: $OPENAI_API_KEY)")
        live.add_argument("--time-scale", type=float, default=1.0, help="tool latencies are waited out x this")
        live.add_argument("--scheduler", default=DEFAULT_SCHEDULER,
                          help="the scheduler's gRPC address, to read the policy it runs; 'none' takes --policy on trust")
        if name == "compare":
            scenarios.add_arguments(sub, one_point=True)  # last: it takes over the defaults a scenario sets
    add_report_parsers(commands)
    scenarios.add_list_parser(commands)


def add_tier_arguments(group: Any) -> None:
    """--host-cache, --l3, --l3-capacity-gb, --l3-write-policy and --cache-policy (``ExperimentConfig``'s
    tier keys and its cache manager)."""
    group.add_argument("--host-cache", default="0", metavar="GB|auto",
                       help="an L2 host KV pool per replica: 0 (none, the default), auto (half the GPU's share "
                            "of the node's DRAM) or GB per GPU")  # fmt: skip
    group.add_argument("--l3", choices=L3_KINDS, default="none",
                       help="memory: one shared L3 store for all replicas (needs --host-cache)")
    group.add_argument("--l3-capacity-gb", type=float, default=1000.0, metavar="GB", help="the L3 store's capacity")
    group.add_argument("--l3-write-policy", choices=WRITE_POLICIES, default="write_through",
                       help="when blocks are written to L3")
    group.add_argument(
        "--cache-policy",
        choices=CACHE_POLICIES.names(),
        default=None,
        help="run a cache manager with this policy (default: none, the engines' LRU alone)",
    )


def tier_config(args: argparse.Namespace) -> dict[str, Any]:
    """The tier keys of ``ExperimentConfig`` from ``add_tier_arguments``' options."""
    return {"host_cache": args.host_cache, "l3": args.l3, "l3_capacity_gb": args.l3_capacity_gb,
            "l3_write_policy": args.l3_write_policy, "cache_policy": args.cache_policy}  # fmt: skip


def add_report_parsers(commands: Any) -> None:
    sub = commands.add_parser("merge", help="compare files of one config (same instance) into one",
                              description="Presets run in separate compares of the identical config give the "
                                          "numbers they give in one compare (the simulator is deterministic and "
                                          "each preset gets its own copy of the warm-up), so their files merge.")  # fmt: skip
    sub.add_argument("parts", type=Path, nargs="+", help="compare results JSON files")
    sub.add_argument("--out", type=Path, required=True, help="merged results JSON")
    sub = commands.add_parser("matrix-report", help="markdown tables (ratios against a baseline) and plots")
    sub.add_argument("results", type=Path, nargs="+", help="compare results JSON files")
    sub.add_argument("--baseline", default=BASELINE)
    sub.add_argument("--summary", action="store_true",
                     help="one row per file: the --focus preset against the baseline and the best of --rivals")  # fmt: skip
    sub.add_argument("--focus", default="clairvoyant", help="with --summary: the preset each row is about")
    sub.add_argument("--rivals", default="autellix,kairos,saga,continuum,thunderagent",
                     help="with --summary: the presets the focus preset is held against (the best of them per row)")  # fmt: skip
    sub.add_argument("--plots", type=Path, help="a folder for matrix-<workload>.png: avg JCT ratio against the load")


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One compare result holding every part's presets; raises ValueError if the parts' configs
    (hence instances) differ or a preset appears twice."""
    # Older files lack newer keys; the scaling, tier and cache keys are in a file only when set.
    defaults = {f.name: f.default for f in dataclasses.fields(ExperimentConfig)
                if f.name not in (*SCALING_KEYS, *TIER_KEYS, *DEFAULT_LEFT_OUT)}  # fmt: skip
    parts = [{**part, "config": {**defaults, **part["config"]}} for part in parts]  # older files lack newer keys
    first = parts[0]
    merged = {**first, "policies": dict(first["policies"]), "wall_seconds": sum(p["wall_seconds"] for p in parts)}
    for part in parts[1:]:
        for key in ("workload", "mode", "seed", "config"):
            if part[key] != first[key]:
                raise ValueError(f"cannot merge: {key} differs ({part[key]!r} != {first[key]!r})")
        twice = set(part["policies"]) & set(merged["policies"])
        if twice:
            raise ValueError(f"cannot merge: {sorted(twice)} in two parts")
        merged["policies"].update(part["policies"])
    return merged


REPORT_COLUMNS = "| preset | avg JCT s | p95 JCT s | tok/s | avg queue s | preemptions | cache hit | dist | avg JCT / {b} | p95 / {b} | tok/s / {b} |"
LIMIT_COLUMNS = " over limit | limit s |"


def load_text(config: dict[str, Any]) -> str:
    """The run's load in words: the closed loop's concurrency, the Poisson rate or the arrival spec."""
    if config.get("concurrency") is not None:
        return f"concurrency {config['concurrency']}"
    if config.get("rate") is not None:
        return f"Poisson {config['rate']:g}/s"
    if config.get("arrivals"):
        return f"arrivals {config['arrivals']}"
    return "all at t = 0"


def gpu_seconds(metrics: dict[str, Any], config: dict[str, Any]) -> float:
    """GPU-seconds a run held: the autoscaler's integral, else the fixed cluster over the run."""
    if "autoscaling" in metrics:
        return float(metrics["autoscaling"]["gpu_seconds"])
    return float(config["gpus"] * metrics["virtual_seconds"])


def report_table(result: dict[str, Any], baseline: str = BASELINE) -> str:
    """Markdown, one row per preset (the baseline first); "dist" is avg JCT over the critical-path
    lower bound.  Files that carry the capacity-aware limit (``avg_jct_over_limit``) also get avg
    JCT over the limit and the limit itself; files run with ``--own-stacks`` say each preset's
    cache and scaling policies and the GPU-seconds it held against the baseline's."""
    config = result["config"]
    if baseline not in result["policies"]:
        raise ValueError(f"{result['workload']}: no {baseline!r} in {sorted(result['policies'])}")
    base = result["policies"][baseline]
    limits = all("avg_jct_over_limit" in m for m in result["policies"].values())
    stacks = bool(config.get("own_stacks"))
    header = REPORT_COLUMNS.format(b=baseline) + (LIMIT_COLUMNS if limits else "")
    if stacks:
        header = header.replace("| preset |", "| preset | cache, scaling |", 1) + f" GPU-s / {baseline} |"
    lines = [
        f"{result['workload']}, {config['gpus']} GPUs ({config.get('gpu', 'H100-80G')}), {load_text(config)}, "
        f"{config['workflows']} workflows, annotations {config['annotations']}",
        "",
        header,
        "|---" + ("|---" if stacks else "") + "|---:" * (10 + 2 * limits + stacks) + "|",
    ]
    presets = [baseline, *sorted(p for p in result["policies"] if p != baseline)]
    for preset in presets:
        m = result["policies"][preset]
        stack = m.get("stack", {})
        lines.append(
            f"| {preset} |" + (f" {stack.get('cache')}, {stack.get('scaling')} |" if stacks else "")
            + f" {m['avg_jct_s']:.1f} | {m['p95_jct_s']:.1f} | {m['throughput_tok_s']:,.0f} "
            f"| {m['avg_queue_s']:.2f} | {m['preemptions']} | {m['cache_hit_ratio']:.3f} "
            f"| {m['distance_from_limit']:.2f} | {m['avg_jct_s'] / base['avg_jct_s']:.3f} "
            f"| {m['p95_jct_s'] / base['p95_jct_s']:.3f} | {m['throughput_tok_s'] / base['throughput_tok_s']:.3f} |"
            + (f" {m['avg_jct_over_limit']:.2f} | {m['limit_avg_jct_s']:.1f} |" if limits else "")
            + (f" {gpu_seconds(m, config) / gpu_seconds(base, config):.3f} |" if stacks else "")
        )
    return "\n".join(lines)


SUMMARY_COLUMNS = (
    "| workload | cell | load | {b} avg JCT s | {f} avg JCT | {f} P95 | {f} tok/s | best rival | {f} vs best rival "
    "| {f} over limit | {b} over limit | best preset |"
)


def _over_limit(metrics: dict[str, Any]) -> str:
    return f"{metrics['avg_jct_over_limit']:.2f}" if "avg_jct_over_limit" in metrics else "-"


def summary_table(cells: list[tuple[Path, dict[str, Any]]], baseline: str, focus: str, rivals: list[str]) -> str:
    """One row per results file: the ``focus`` preset's avg JCT, P95 and throughput as ratios to the
    baseline's, the best of ``rivals`` by avg JCT and the focus preset's avg JCT over that rival's
    (below 1: the focus preset is faster), both presets' avg JCT over the limit, and the preset with
    the lowest avg JCT in the file.  ValueError when a file lacks the baseline or the focus preset."""
    lines = [SUMMARY_COLUMNS.format(b=baseline, f=focus), "|---|---|---" + "|---:" * 4 + "|---" + "|---:" * 3 + "|---|"]
    for path, result in cells:
        policies = result["policies"]
        for needed in (baseline, focus):
            if needed not in policies:
                raise ValueError(f"{path}: no {needed!r} in {sorted(policies)}")
        base, mine = policies[baseline], policies[focus]
        present = [r for r in rivals if r in policies]
        rival = min(present, key=lambda r: policies[r]["avg_jct_s"]) if present else None
        best = min(policies, key=lambda p: policies[p]["avg_jct_s"])
        versus = f"{mine['avg_jct_s'] / policies[rival]['avg_jct_s']:.3f}" if rival else "-"
        workload = result["workload"]
        cell = path.stem.removeprefix(f"{_family(path)}-").replace(f"{workload}-", "").replace(f"-{workload}", "")
        lines.append(
            f"| {workload} | {cell} | {load_text(result['config'])} | {base['avg_jct_s']:.1f} "
            f"| {mine['avg_jct_s'] / base['avg_jct_s']:.3f} | {mine['p95_jct_s'] / base['p95_jct_s']:.3f} "
            f"| {mine['throughput_tok_s'] / base['throughput_tok_s']:.3f} | {rival or '-'} | {versus} "
            f"| {_over_limit(mine)} | {_over_limit(base)} | {best} |"
        )
    return "\n".join(lines)


def _family(path: Path) -> str:
    """The cell family a results file belongs to, from its name: ``headline-deep_research-peak.json``
    -> ``headline`` (``matrix`` when the name has no dash)."""
    return path.stem.split("-", 1)[0] if "-" in path.stem else "matrix"


def report_command(args: argparse.Namespace) -> int:
    loaded = [json.loads(path.read_text()) for path in (args.parts if args.command == "merge" else args.results)]
    if args.command == "merge":
        try:
            merged = merge(loaded)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(merged, indent=2, sort_keys=True, default=str) + "\n")
        progress(f"saved {args.out}: {', '.join(merged['policies'])}")
        return 0
    try:
        if args.summary:
            rivals = [r for r in args.rivals.split(",") if r]
            print(summary_table(list(zip(args.results, loaded, strict=True)), args.baseline, args.focus, rivals) + "\n")
        else:
            for result in loaded:
                print(report_table(result, args.baseline) + "\n")
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.plots:
        from clairvoyant.bench.plots import plot_cells, plot_matrix  # matplotlib only when plotting

        groups: dict[tuple[str, str, str], list[tuple[Path, dict[str, Any]]]] = {}
        for path, result in zip(args.results, loaded, strict=True):
            key = (_family(path), result["workload"], result["config"]["annotations"])
            groups.setdefault(key, []).append((path, result))
        for (family, workload, annotations), cells in groups.items():
            if len(cells) > 1:
                suffix = "" if annotations == "profiler" else f"-{annotations}"
                out = args.plots / f"{family}-{workload}{suffix}.png"
                results = [r for _, r in cells]
                if all(r["config"].get("concurrency") is not None for r in results):
                    path = plot_matrix(results, out, args.baseline)
                else:  # bursts or other arrivals beside the closed loops: one bar group per file
                    labels = [p.stem.removeprefix(f"{family}-").removeprefix(f"{workload}-") for p, _ in cells]
                    path = plot_cells(results, labels, out, args.baseline)
                progress(f"saved {path}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    if args.command in ("merge", "matrix-report"):
        return report_command(args)
    if args.command == "scenarios":
        print(scenarios.listing())
        return 0
    chosen = scenarios.resolve_compare(args)  # compare --scenario: its point's options, flags given winning
    scalings = [n for n in (getattr(args, "scalings", None) or "").split(",") if n]
    if args.command == "run":
        policies = [args.policy]
    elif args.policies is None and not scalings:
        raise SystemExit("error: compare needs --policies (or --scalings)")
    else:
        policies = [p for p in (args.policies or SCALE_PRESET).split(",") if p]
    unknown = [p for p in policies if p not in PRESETS]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {PRESETS.names()}")
    if scalings and (len(policies) != 1 or args.scaling is not None):
        raise SystemExit("error: --scalings varies the scaling policy: give one preset in --policies and no --scaling")
    config = ExperimentConfig(
        workload=args.workload, gpus=args.gpus, gpu=args.gpu, workflows=args.workflows,
        rate=args.rate, concurrency=args.concurrency, arrivals=args.arrivals, seed=args.seed,
        block_size=args.block_size, max_num_seqs=args.max_num_seqs, annotations=args.annotations,
        warmup_workflows=args.warmup_workflows, scaling=args.scaling, gpu_budget=args.gpu_budget, scale_interval_s=args.scale_interval,
        placement=args.placement, knee_fraction=args.knee_fraction, knee_displace=args.knee_displace,
        own_stacks=args.own_stacks, **tier_config(args),
    )  # fmt: skip
    try:
        check_tiers(config)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.mode == "live" and (tiers_on(config) or args.l3 != "none" or args.cache_policy is not None):
        raise SystemExit("error: --host-cache, --l3 and --cache-policy apply to --mode sim; "
                         "live workers and the cache manager have their own settings")  # fmt: skip
    for each in [dataclasses.replace(config, scaling=name) for name in scalings] or [config]:
        try:
            check_scaling(each)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    scaling_given = args.scaling is not None or scalings or args.gpu_budget is not None
    if args.mode == "live" and scaling_given:
        raise SystemExit("error: --scaling, --scalings and --gpu-budget apply to --mode sim")
    if args.own_stacks and (args.mode == "live" or args.scaling is not None or scalings or args.cache_policy is not None):
        raise SystemExit("error: --own-stacks applies to --mode sim and takes each preset's own cache and scaling "
                         "policies: give neither --cache-policy, --scaling nor --scalings")  # fmt: skip
    if args.gpu_budget is not None and args.scaling is None and not scalings and not args.own_stacks:
        raise SystemExit("error: --gpu-budget needs --scaling (or --scalings, --own-stacks)")
    if args.arrivals is not None:
        try:
            parse_arrivals(args.arrivals)
        except (ValueError, WorkloadDataError) as exc:
            raise SystemExit(f"error: --arrivals: {exc}") from None
    if args.block_size <= 0:
        raise SystemExit(f"error: --block-size must be positive, got {args.block_size}")
    if args.max_num_seqs <= 0:
        raise SystemExit(f"error: --max-num-seqs must be positive, got {args.max_num_seqs}")
    if args.knee_fraction is not None or args.knee_displace:
        if args.knee_fraction is not None and not 0.0 < args.knee_fraction <= 1.0:
            raise SystemExit(f"error: --knee-fraction must be in (0, 1], got {args.knee_fraction}")
        if args.mode == "live":
            raise SystemExit("error: --knee-fraction and --knee-displace apply to --mode sim; live, they are the preset's")
        for name in policies:
            if Capability.ADMITS not in capabilities_of(ROUTING_POLICIES.create(PRESETS.create(name).routing)):
                raise SystemExit(f"error: --knee-fraction and --knee-displace need presets that admit at the knee; {name} does not")
    if args.mode == "live" and args.max_num_seqs != 256:
        raise SystemExit("error: --max-num-seqs applies to --mode sim; live workers use their own setting")
    if args.warmup_workflows < 0:
        raise SystemExit(f"error: --warmup-workflows must be >= 0, got {args.warmup_workflows}")
    if args.mode == "live" and args.annotations != "none":
        raise SystemExit("error: --annotations applies to --mode sim; a live stack has its own profiler")
    if args.mode == "live" and args.placement != "equal":
        raise SystemExit("error: --placement applies to --mode sim; a live stack has its own replicas")
    if args.mode == "live" and args.block_size != 16:
        raise SystemExit("error: --block-size applies to --mode sim; live workers use their own setting")
    jobs = getattr(args, "jobs", None)
    if jobs is not None and jobs < 1:
        raise SystemExit(f"error: --jobs must be at least 1, got {jobs}")
    if args.mode == "live" and jobs is not None:
        raise SystemExit("error: --jobs applies to --mode sim; a live stack serves one policy")
    progress(f"{args.command}: {args.workload}, {len(policies)} policies, {args.workflows} workflows, {args.gpus} GPUs")
    live = LiveOptions(
        base_url=args.base_url, api_key=args.api_key, time_scale=args.time_scale,
        scheduler=None if args.scheduler.lower() == "none" else args.scheduler,
    )  # fmt: skip
    try:
        if args.mode == "sim" and scalings:
            with RunBars([f"{args.workload} {policies[0]} scaling {name}" for name in scalings]) as bars:
                jobs = jobs or default_jobs(len(scalings))
                result = scale_compare(config, scalings, policies[0], jobs=jobs, on_progress=bars.update,
                                       on_warmup=lambda warmup: _warn(bars, warmup))  # fmt: skip
        elif args.mode == "sim":
            with RunBars([f"{args.workload} {policy}" for policy in policies]) as bars:
                jobs = jobs or default_jobs(len(policies))
                result = compare(config, policies, jobs=jobs, on_progress=bars.update,
                                 on_warmup=lambda warmup: _warn(bars, warmup))  # fmt: skip
        else:
            result = compare_live(config, policies, live)
    except LiveModeError as exc:
        raise SystemExit(f"error: {exc}") from None
    if chosen is not None:
        result["scenario"] = chosen
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    shown = (*SHOWN, "gpu_seconds") if config.scaling is not None or scalings else SHOWN
    print(f"| {'scaling' if scalings else 'policy'} | " + " | ".join(shown) + " |")
    print("|---" * (len(shown) + 1) + "|")
    for policy, metrics in result["policies"].items():
        values = {**metrics, **metrics.get("autoscaling", {})}
        print(f"| {policy} | " + " | ".join(f"{values[k]:.3g}" if k in values else "-" for k in shown) + " |")
    if scalings or config.scaling is not None:
        print(scaling_table(result))
    if tiers_on(config) or config.cache_policy is not None:
        print(tier_table(result))
    progress(f"saved {args.out}")
    return 0


def _warn(bars: RunBars, warmup: dict[str, Any]) -> None:
    warning = warmup_warning(warmup)
    if warning is not None:
        bars.print(warning)


def tier_table(result: dict[str, Any]) -> str:
    """Markdown: per entry, the hit ratio by tier and the prefill tokens saved (``kv_tiers``), and
    with a cache manager the speculative tokens it wasted."""
    lines = ["| entry | hit L1 | hit L2 | hit L3 | prefill tokens saved | demoted blocks | promoted blocks "
             "| speculative tokens | wasted |", "|---" + "|---:" * 8 + "|"]  # fmt: skip
    for name, metrics in result["policies"].items():
        tiers = metrics.get("kv_tiers")
        if tiers is None:
            continue
        ratio = tiers["hit_ratio"]
        cache = metrics.get("cache_manager")
        speculation = (
            f"{cache['speculative_tokens']:,} | {cache['wasted_speculative_tokens']:,}"
            if cache is not None
            else "- | -"
        )
        lines.append(
            f"| {name} | {ratio['l1']:.3f} | {ratio['l2']:.3f} | {ratio['l3']:.3f} | {tiers['prefill_tokens_saved']:,} "
            f"| {tiers['demoted_blocks']:,} | {tiers['promoted_blocks']:,} | {speculation} |"
        )
    return "\n".join(lines)


def scaling_table(result: dict[str, Any]) -> str:
    """Markdown: per entry (a scaling policy, or a preset under one), the global queue wait per
    model (mean / P95 s), avg and P95 JCT, GPU-seconds and the replicas started."""
    entries = result["policies"]
    models = sorted({m for metrics in entries.values() for m in metrics.get("global_queue_s_by_model", {})})
    head = "| entry | " + " | ".join(f"{m} queue mean / p95 s" for m in models)
    lines = [head + " | avg JCT s | p95 JCT s | GPU-s | scale-ups |", "|---" * (len(models) + 5) + "|"]
    for name, metrics in entries.items():
        queue = metrics.get("global_queue_s_by_model", {})
        cells = [f"{queue[m]['mean_s']:.2f} / {queue[m]['p95_s']:.2f}" if m in queue else "-" for m in models]
        scaled = metrics.get("autoscaling", {})
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {metrics['avg_jct_s']:.1f} | {metrics['p95_jct_s']:.1f} "
            f"| {scaled.get('gpu_seconds', 0.0):,.0f} | {scaled.get('scale_ups', 0)} |"
        )
    return "\n".join(lines)
