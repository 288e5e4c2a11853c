"""Named scenarios: the papers' operating points, for ``compare --scenario`` and ``sweep --scenario``.

A scenario is one figure of a paper brought to our simulator: the workloads the figure used, the
load points along its x axis (each with how many workflows run there), the cluster size, the
presets standing for the systems it compared, and the simulator settings the figure's runs need.
Each factory's docstring says where the figure is and how it was scaled to a run of minutes on
this machine.

``compare --scenario NAME`` runs one point (the scenario's default, or ``--point N``); ``sweep
--scenario NAME`` runs all of them.  A flag given on the command line wins over the scenario's
value; the results file names the scenario (and, for ``compare``, the point).

    python -m clairvoyant.bench scenarios
    python -m clairvoyant.bench compare --scenario pythia-fig11 --point 3 --out fig11-cv4.json
    python -m clairvoyant.bench sweep --scenario autellix-rate --workload react_bfcl --out autellix-bfcl.json
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from clairvoyant.bench.arrivals import parse_arrivals
from clairvoyant.bench.experiment import ANNOTATORS
from clairvoyant.bench.workloads import WorkloadDataError, check_workload_name
from clairvoyant.core.registry import Registry
from clairvoyant.policy import PRESETS

LOAD_KINDS = ("concurrency", "rate", "arrivals")
# Options a scenario sets.  The parsers that take --scenario leave them None, so that a flag given on
# the command line can be told from one left out; ``resolve`` then fills in the scenario's value or
# the option's usual default (kept as ``scenario_usual`` on the parsed arguments).
SCENARIO_KEYS = ("workload", "gpus", "workflows", "block_size", "annotations", "warmup_workflows")


class LoadPoint(NamedTuple):
    """One point of a figure's x axis."""

    load: float  # concurrency, workflows/s, or what the scenario's ``axis`` names (load kind "arrivals")
    workflows: int  # how many workflows run at this point
    arrivals: str | None = None  # load kind "arrivals": the arrival process here (``parse_arrivals``)


@dataclass(frozen=True)
class Scenario:
    name: str
    figure: str  # where in the paper, e.g. "Pythia §7.1, Fig. 7"
    summary: str  # one line, for the listing
    load_kind: str  # concurrency (closed loop) | rate (Poisson) | arrivals (a process per point)
    axis: str  # what ``LoadPoint.load`` is, in words
    points: Mapping[str, tuple[LoadPoint, ...]]  # per workload of the figure; the first is the default
    default_point: int  # index into each workload's points
    gpus: int
    presets: tuple[str, ...]  # the systems the figure compared, as our presets
    annotations: str = "profiler"
    warmup_workflows: int = 32
    block_size: int = 64

    @property
    def workloads(self) -> list[str]:
        return list(self.points)

    def points_for(self, workload: str) -> tuple[LoadPoint, ...]:
        """The workload's points; a workload the figure did not use runs at the default workload's."""
        return self.points.get(workload, self.points[self.workloads[0]])

    def check(self) -> None:
        """Raise ValueError naming the first bad value: an unknown workload, preset or annotator, a
        load point that is not a valid load, or a default point out of range.  An arrival process
        whose trace data is missing raises WorkloadDataError."""
        if self.load_kind not in LOAD_KINDS:
            raise ValueError(f"{self.name}: load kind must be one of {LOAD_KINDS}, got {self.load_kind!r}")
        if not self.points:
            raise ValueError(f"{self.name}: no workloads")
        for workload, points in self.points.items():
            check_workload_name(workload)
            if not 0 <= self.default_point < len(points):
                raise ValueError(f"{self.name}: default point {self.default_point} out of range for {workload}'s "
                                 f"{len(points)} points")  # fmt: skip
            for point in points:
                self._check_point(workload, point)
        unknown = [p for p in self.presets if p not in PRESETS]
        if unknown or not self.presets:
            raise ValueError(f"{self.name}: unknown presets {unknown}; choose from {PRESETS.names()}")
        if self.annotations not in ANNOTATORS:
            raise ValueError(
                f"{self.name}: unknown annotations {self.annotations!r}; choose from {list(ANNOTATORS)}"
            )
        if self.gpus < 1 or self.block_size < 1 or self.warmup_workflows < 0:
            raise ValueError(f"{self.name}: need gpus >= 1, block_size >= 1 and warmup_workflows >= 0")

    def _check_point(self, workload: str, point: LoadPoint) -> None:
        where = f"{self.name}, {workload}, load {point.load:g}"
        if point.workflows < 1:
            raise ValueError(f"{where}: workflows must be >= 1, got {point.workflows}")
        if not (point.load >= 0 if self.load_kind == "arrivals" else point.load > 0):
            raise ValueError(f"{where}: a {self.load_kind} must be > 0 (an arrivals axis value >= 0)")
        if self.load_kind == "concurrency" and point.load != int(point.load):
            raise ValueError(f"{where}: a concurrency must be a whole number")
        if (point.arrivals is None) != (self.load_kind != "arrivals"):
            raise ValueError(f"{where}: an arrival process goes with load kind 'arrivals' and only there")
        if point.arrivals is not None:
            parse_arrivals(point.arrivals)


SCENARIOS: Registry[Scenario] = Registry("scenario")


def get_scenario(name: str) -> Scenario:
    """The registered scenario; ValueError naming the registered ones if there is none."""
    return SCENARIOS.create(name)


# ---- the scenarios ---------------------------------------------------------------------------------

PYTHIA_BASELINES = ("vllm-prodstack", "sglang-gw", "continuum", "autellix", "thunderagent", "pythia")


def _closed_loop(*concurrencies: int) -> tuple[LoadPoint, ...]:
    """1.5 workflows per slot at each concurrency, as the presets and matrix runs (docs/benchmarks.md)."""
    return tuple(LoadPoint(c, c * 3 // 2) for c in concurrencies)


def _poisson(horizon_s: float, *rates: float, least: int = 32) -> tuple[LoadPoint, ...]:
    """Each rate with the workflows that arrive within ``horizon_s`` (at least ``least``)."""
    return tuple(LoadPoint(rate, max(least, round(rate * horizon_s))) for rate in rates)


@SCENARIOS.register("pythia-fig7")
def pythia_fig7() -> Scenario:
    """Pythia §7.1, Fig. 7: average and P95 JCT and output-token throughput as the number of
    concurrent workflows grows to the peak, on the coding assistant and the deep research agent,
    against vLLM + Production Stack, SGLang, Continuum and Autellix.

    Scaling: the paper's 8 A100s become 4 H100s (2 replicas of each served model, so routing
    still chooses); the figure's concurrencies are not in the text, so ours run from light
    (c = 32) to the knee of fcfs-rr on this cluster (coding assistant, c = 256: 7,343 tok/s, 260
    preemptions, +53 % over c = 128; c = 384 adds only 14 % for +37 % JCT, 951 preemptions and 3x
    the simulation time; deep research already thrashes at c = 256: 1,767 preemptions, 32 s
    queues), each with 1.5x as many workflows as slots.  ThunderAgent runs as Pythia ran it (`thunderagent`).  Pythia's runs learn from its
    profiler, so the scenario uses profiler annotations (a 32-workflow warm-up, to keep a compare
    at the peak within minutes) and 64-token KV blocks (~2.5x faster to simulate)."""
    points = _closed_loop(32, 64, 128, 192, 256)
    return Scenario(
        name="pythia-fig7", figure="Pythia §7.1, Fig. 7",
        summary="concurrency sweep to the peak, coding assistant and deep research, vs. five systems",
        load_kind="concurrency", axis="concurrent workflows",
        points={"coding_assistant": points, "deep_research": points}, default_point=4,
        gpus=4, presets=PYTHIA_BASELINES,
    )  # fmt: skip


@SCENARIOS.register("pythia-fig9")
def pythia_fig9() -> Scenario:
    """Pythia §7.2, Fig. 9: GPU queue dynamics while bursts of coding-assistant workflows arrive,
    FCFS, Continuum and Autellix against Pythia (the results' ``queue_depth_series`` is the figure).

    Scaling: the paper gives neither burst size nor spacing; here a burst of B workflows arrives
    at once every 300 s (``cron``), three bursts per run, B = 32, 64 and 96 (mean rates 0.11-0.32
    workflows/s, up to ~90 % of this cluster's closed-loop peak of ~0.36/s).  4 H100s, as in
    pythia-fig7; FCFS is fcfs-rr (FCFS with round-robin routing); profiler annotations."""
    points = tuple(LoadPoint(batch, 3 * batch, f"cron:period_s=300,batch={batch}") for batch in (32, 64, 96))
    return Scenario(
        name="pythia-fig9", figure="Pythia §7.2, Fig. 9",
        summary="bursts of coding-assistant workflows; queue depth over time per model",
        load_kind="arrivals", axis="workflows per burst (one burst every 300 s)",
        points={"coding_assistant": points}, default_point=1,
        gpus=4, presets=("fcfs-rr", "continuum", "autellix", "pythia"),
    )  # fmt: skip


@SCENARIOS.register("pythia-fig11")
def pythia_fig11() -> Scenario:
    """Pythia §7.3, Fig. 11: average JCT and throughput as the arrival-interval CV goes 0 (even),
    1 (Poisson), 2 and 4 (bursty), at one mean rate.

    Scaling: the text names neither the workload nor the rate.  We take the coding assistant (the
    paper's main workload) on 4 H100s at 0.3 workflows/s, ~80 % of fcfs-rr's closed-loop peak
    there, so that bursts queue and lulls drain (fcfs-rr: avg JCT 396 s at CV 0, 433 s at CV 4);
    gamma inter-arrivals (``bursty``), 256 workflows (~850 s of arrivals, a few JCTs).  The compared systems are those of Fig. 7; profiler
    annotations."""
    points = tuple(LoadPoint(cv, 256, f"bursty:rate=0.3,cv={cv:g}") for cv in (0, 1, 2, 4))
    return Scenario(
        name="pythia-fig11", figure="Pythia §7.3, Fig. 11",
        summary="arrival-interval CV 0, 1, 2, 4 at 0.3 workflows/s, coding assistant",
        load_kind="arrivals", axis="CV of the arrival intervals",
        points={"coding_assistant": points}, default_point=3,
        gpus=4, presets=PYTHIA_BASELINES,
    )  # fmt: skip


@SCENARIOS.register("autellix-rate")
def autellix_rate() -> Scenario:
    """Autellix (Agentix) §6.3, Fig. 12: program latency against the Poisson arrival rate of
    programs on one engine of LLaMA-3.1-8B, for ShareGPT (chatbot), BFCL (react_bfcl), LATS
    (mcts_lats) and their equal mix, against vLLM and MLFQ.

    Scaling: one H100 for the paper's one A100.  The rates are not in the text; each workload's
    run from light to just past fcfs-rr's knee on this engine (probed: chatbot JCT 25 s at 1.5/s,
    83 s with 181 preemptions at 3/s; react_bfcl 6 s at 12/s, 15 s at 20/s; mcts_lats and the mix
    by their ~4,000-5,000 tok/s ceiling).  Each point runs the workflows arriving within 240 s
    (react_bfcl 120 s, mcts_lats 300 s).  vLLM and vLLM-opt are both fcfs-rr here (the simulator
    always caches prefixes); Autellix is the ``autellix`` preset (its K-queue PLAS/ATLAS).  No
    annotations: Autellix uses none."""
    return Scenario(
        name="autellix-rate", figure="Autellix §6.3, Fig. 12 (tails: Fig. 13)",
        summary="Poisson program-rate sweep on one 8B engine: chatbot, react_bfcl, mcts_lats, mixed",
        load_kind="rate", axis="programs/s",
        points={
            "chatbot": _poisson(240, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0),
            "react_bfcl": _poisson(120, 4, 8, 12, 16, 20, 24),
            "mcts_lats": _poisson(300, 0.2, 0.4, 0.6, 0.8, 1.0),
            "chatbot+react_bfcl+mcts_lats": _poisson(240, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5),
        },
        default_point=3, gpus=1, presets=("fcfs-rr", "mlfq", "autellix"), annotations="none",
    )  # fmt: skip


@SCENARIOS.register("kairos-rate")
def kairos_rate() -> Scenario:
    """Kairos §7.3 and §7.6, Figs. 15 and 18: latency of the co-located QA, report-generation and
    code-generation applications on a shared Llama3-8B as the request rate grows, Parrot (FCFS,
    round-robin) and Ayo (topology depth, round-robin) against Kairos.

    Scaling: the paper's 4 A40s become 4 H100s (4 replicas of llama-3.1-8b).  Arrivals follow the
    production trace it cites (the Azure LLM inference trace 2023; we take its conversation half,
    inter-arrival CV ~1.1, which the paper does not name) scaled to each mean rate; it sweeps the
    rate until queueing is up to 90 % of latency, which our faster GPUs reach near 24-32
    workflows/s (fcfs-rr: queue 0.4 s at 24/s, 6.2 s at 32/s, throughput flat).  Each point runs
    the workflows arriving within 120 s.  Profiler annotations (Kairos learns agents' latency)."""
    points = tuple(
        LoadPoint(rate, round(rate * 120), f"azure_replay:kind=conv,rate={rate:g}")
        for rate in (4, 8, 16, 24, 32)
    )
    return Scenario(
        name="kairos-rate", figure="Kairos §7.3, Fig. 15; §7.6, Fig. 18",
        summary="request-rate sweep, kairos_mix on 4 shared 8B replicas, Azure trace arrivals",
        load_kind="arrivals", axis="workflows/s (Azure conv trace, rescaled)",
        points={"kairos_mix": points}, default_point=3,
        gpus=4, presets=("fcfs-rr", "topo-depth", "kairos"),
    )  # fmt: skip


@SCENARIOS.register("saga-sessions")
def saga_sessions() -> Scenario:
    """SAGA §9.2, Table 3: task completion time of SWE-bench and WebArena agent sessions on
    Llama-3-70B (TP 4), tasks arriving as a Poisson process, against vLLM, vLLM + APC with
    affinity routing, and SGLang.

    Scaling: the paper's 64 A100s (16 instances) become 8 H100s (2 instances at TP 4).  It gives
    the offered load only for its multi-tenant run (~80 % of peak); our points run from light to
    past fcfs-rr's peak on this cluster (swe_agent: JCT 260 s at 0.1/s, 525 s with 110
    preemptions at 0.15/s; webarena flattens near 0.4/s), the default point at ~80 % of it.
    64 (webarena 128) workflows per point.  vLLM is fcfs-rr, vLLM + APC vllm-prodstack (session
    affinity, LMCache), SGLang sglang-gw; Llumnix, TRT-LLM and KVFlow have no preset.  The
    multi-tenant BurstGPT run (§9.6) is not reproduced: our workloads have no tenants."""
    return Scenario(
        name="saga-sessions", figure="SAGA §9.2, Table 3",
        summary="Poisson task-rate sweep, swe_agent and webarena sessions on two 70B replicas",
        load_kind="rate", axis="tasks/s",
        points={
            "swe_agent": tuple(LoadPoint(rate, 64) for rate in (0.03, 0.06, 0.09, 0.12)),
            "webarena": tuple(LoadPoint(rate, 128) for rate in (0.1, 0.2, 0.3, 0.4)),
        },
        default_point=2, gpus=8, presets=("fcfs-rr", "vllm-prodstack", "sglang-gw", "saga"),
    )  # fmt: skip


# ---- command line ----------------------------------------------------------------------------------


def listing() -> str:
    """One line per scenario (name, figure, summary), then its workloads, points and presets."""
    lines = []
    for name in SCENARIOS.names():
        scenario = get_scenario(name)
        lines.append(f"{name:14} {scenario.figure}: {scenario.summary}")
        for workload, points in scenario.points.items():
            loads = ", ".join(f"{p.load:g}" for p in points)
            lines.append(
                f"{'':14}   {workload}: {scenario.axis} {loads} (default {points[scenario.default_point].load:g})"
            )
        gpus = f"{scenario.gpus} GPU{'s' if scenario.gpus > 1 else ''}"
        lines.append(f"{'':14}   {gpus}; presets {','.join(scenario.presets)}")
    return "\n".join(lines)


class _ScenarioAction(argparse.Action):
    """``--scenario list`` prints the scenarios and exits (before required options are checked)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        if values == "list":
            print(listing())
            parser.exit(0)
        setattr(namespace, self.dest, values)


def add_arguments(parser: argparse.ArgumentParser, *, one_point: bool) -> None:
    """--scenario (and with ``one_point``, --point) on a parser that already has the options in
    ``SCENARIO_KEYS``; those now default to None, their usual defaults kept for ``resolve_compare``
    and ``resolve_sweep``."""
    parser.add_argument("--scenario", metavar="NAME", action=_ScenarioAction,
                        help="a paper's operating point, e.g. pythia-fig11 ('list': print them); "
                             "flags given as well override its values")  # fmt: skip
    if one_point:
        parser.add_argument(
            "--point",
            type=int,
            metavar="N",
            help="with --scenario: which load point, from 0 (default: the scenario's)",
        )
    usual = {key: parser.get_default(key) for key in SCENARIO_KEYS}
    parser.set_defaults(scenario_usual=usual, **dict.fromkeys(SCENARIO_KEYS))


def add_list_parser(commands: Any) -> None:
    commands.add_parser(
        "scenarios", help="the named scenarios (papers' operating points) and their load points"
    )


def _fill(args: argparse.Namespace, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def fill_defaults(args: argparse.Namespace) -> None:
    """Without --scenario: the options in ``SCENARIO_KEYS`` left out get their usual defaults."""
    _fill(args, args.scenario_usual)


def _scenario(args: argparse.Namespace) -> Scenario:
    try:
        scenario = get_scenario(args.scenario)
        scenario.check()
    except (ValueError, WorkloadDataError) as exc:
        raise SystemExit(f"error: --scenario: {exc}") from None
    return scenario


def _fill_common(args: argparse.Namespace, scenario: Scenario) -> None:
    _fill(args, {"gpus": scenario.gpus})
    if getattr(args, "mode", "sim") == "sim":  # a live stack has its own block size and profiler
        _fill(args, {"block_size": scenario.block_size, "annotations": scenario.annotations,
                     "warmup_workflows": scenario.warmup_workflows})  # fmt: skip
    _fill(args, args.scenario_usual)
    if args.policies is None:
        args.policies = ",".join(scenario.presets)


def resolve_compare(args: argparse.Namespace) -> dict[str, Any] | None:
    """Fill ``compare``'s scenario options in place: from ``--scenario``'s point where given, else
    their usual defaults.  Returns what the results file records of the scenario (None without
    one); SystemExit with a clear message for an unknown scenario or point, or a missing workload."""
    usual = getattr(args, "scenario_usual", None)
    if usual is None:  # a parser without --scenario (``run``)
        return None
    if args.scenario is None:
        if args.point is not None:
            raise SystemExit("error: --point needs --scenario")
        fill_defaults(args)
        if args.workload is None:
            raise SystemExit(
                "error: compare needs --workload (or --scenario NAME; --scenario list names them)"
            )
        return None
    scenario = _scenario(args)
    workload = args.workload or scenario.workloads[0]
    points = scenario.points_for(workload)
    index = scenario.default_point if args.point is None else args.point
    if not 0 <= index < len(points):
        raise SystemExit(
            f"error: --point {index}: {scenario.name} has points 0-{len(points) - 1} for {workload}"
        )
    point = points[index]
    load_given = any(getattr(args, key) is not None for key in ("rate", "concurrency", "arrivals"))
    if not load_given:
        if scenario.load_kind == "concurrency":
            args.concurrency = int(point.load)
        elif scenario.load_kind == "rate":
            args.rate = point.load
        else:
            args.arrivals = point.arrivals
    _fill(args, {"workload": workload, "workflows": point.workflows})
    _fill_common(args, scenario)
    return {"name": scenario.name, "figure": scenario.figure, "point": None if load_given else index,
            "load": None if load_given else point.load, "axis": scenario.axis}  # fmt: skip


class SweepPlan(NamedTuple):
    """What ``sweep --scenario`` runs: the load kind and levels, and the workflows at each (empty
    where the command line gives them)."""

    load_kind: str
    loads: list[float]
    workflows: list[int]
    arrivals: list[str] | None  # load kind "arrivals": one process per level
    record: dict[str, Any]  # what the results file records of the scenario


def resolve_sweep(args: argparse.Namespace, loads_given: bool) -> SweepPlan:
    """Fill ``sweep``'s scenario options in place from ``--scenario`` (every point of the workload).
    With ``loads_given`` (--rates or --concurrencies) the command line's levels replace the points
    and the plan has none; with --workflows given, the plan's workflow counts are left empty."""
    scenario = _scenario(args)
    workload = args.workload or scenario.workloads[0]
    points = scenario.points_for(workload)
    workflows_given = args.workflows is not None
    _fill(args, {"workload": workload})
    _fill_common(args, scenario)
    record = {
        "name": scenario.name,
        "figure": scenario.figure,
        "axis": None if loads_given else scenario.axis,
    }
    if loads_given:
        return SweepPlan("", [], [], None, record)
    counts = [] if workflows_given else [p.workflows for p in points]
    arrivals = (
        [p.arrivals for p in points if p.arrivals is not None] if scenario.load_kind == "arrivals" else None
    )
    return SweepPlan(scenario.load_kind, [p.load for p in points], counts, arrivals, record)
