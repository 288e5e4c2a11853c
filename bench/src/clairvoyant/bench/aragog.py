"""``aragog``: Aragog against per-input and per-workflow configuration selection (seeds/002 §5).

    python -m clairvoyant.bench aragog                                  # the four workloads
    python -m clairvoyant.bench aragog --workloads self_refine --quick

The seed's setup (§5.1), in the simulator: 8 H100s with Qwen-2.5 32B on 4 GPUs, 14B on 2 and 7B on
one; the eighth GPU runs Aragog's routers, and for the baselines, which have no router, a second 7B.
Each workload's calls name the model group of the three sizes; its inputs carry difficulty and
accuracy labels (``clairvoyant.workloads.accuracy``).  Arrivals are Poisson at each of ``--rates``;
every arm runs the same programs at the same times.

- ``aragog``: a classifier router per configuration, trained on ``--train-inputs`` labelled inputs
  of another seed, searched with chain pruning within the routing budget (each router call costs
  ``--router-call-ms`` of virtual time), then the stage-wise beam search (``--beam-width``).
- ``aragog-per-input``: the cheapest accurate configuration per request from an oracle (§5.1), fixed
  at arrival, no routing time.
- ``aragog-per-workflow``: one configuration per workload, the cheapest whose accuracy on the
  training inputs matches the reference's (within ``--match-points``), from an oracle.

Reported per arm: the maximum throughput over the rates (completed workflows per second, from the
first arrival to the last completion), P25/P50/P95 end-to-end latency at the highest rate (the
peak), and accuracy against the all-largest configuration on the same inputs; for Aragog also the
router's precision and recall on the run's inputs, its routing time per request and how much of it
the first stage's queueing hid.
"""

from __future__ import annotations

import argparse
import multiprocessing
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from clairvoyant.bench.arrivals import Poisson
from clairvoyant.bench.common import BENCHMARKS, BenchResult, percentile, progress
from clairvoyant.bench.experiment import ExperimentConfig, _no_sleep, replica_spec
from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.autoscaling import KNEE_SLOWDOWN
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.workloads import get_workload
from clairvoyant.core.configspace import ConfigSpace
from clairvoyant.core.model_groups import GroupWorkflow, ModelGroup, ModelGroups
from clairvoyant.policy.aragog.classifier import ClassifierRouter
from clairvoyant.policy.aragog.policy import AragogRouting, PerInputRouting, PerWorkflowRouting
from clairvoyant.policy.aragog.routers import KnownSetsRouter, LabelledInput, precision_recall
from clairvoyant.policy.aragog.scheduler import StageScheduler
from clairvoyant.policy.aragog.types import EngineProfile
from clairvoyant.policy.scheduling import PRIORITY_POLICIES, RoutingPolicy
from clairvoyant.scheduler.core import GlobalScheduler
from clairvoyant.worker.costmodel.roofline import BatchItem
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.accuracy import WorkflowInput, config_space, labelled_inputs, model_costs
from clairvoyant.workloads.generator import SpecWorkload
from clairvoyant.workloads.program import WorkflowProgram

WORKLOADS = ("self_refine", "voting", "task_decomposition", "text_to_sql")
ARMS = ("aragog", "aragog-oracle", "aragog-per-input", "aragog-per-workflow")
BASELINES = ("aragog-per-input", "aragog-per-workflow")
GROUP = "qwen2.5-auto"
# §5.1: "tensor parallelism with a degree of 2 for 14B models and 4 for 32B and larger models".
TENSOR_PARALLEL = {"qwen2.5-7b": 1, "qwen2.5-14b": 2, "qwen2.5-32b": 4}
# Workflows/s per workload: from well under to past the baselines' capacity (measured once here).
DEFAULT_RATES = {
    "self_refine": (4.0, 10.0, 16.0),
    "voting": (3.0, 7.0, 12.0),
    "task_decomposition": (6.0, 14.0, 24.0),
    "text_to_sql": (5.0, 12.0, 20.0),
}
DEFAULT_ROUTER_CALL_MS = 1.0
SATURATIONS = ("knee", "flat")  # how a replica's saturation batch is found (``engine_profiles``)
FLAT_GAIN = 0.1  # "flat": one more call adds under 10 % of the batch-1 throughput


@dataclass(frozen=True)
class AragogSetup:
    workload: str
    rates: tuple[float, ...]
    workflows: int = 1500
    seed: int = 0
    train_inputs: int = 2000
    beam_width: int = 4
    router_call_s: float = DEFAULT_ROUTER_CALL_MS / 1e3
    match_points: float = 1.0  # per-workflow: accuracy within this many points of the reference's
    saturation: str = "knee"  # SATURATIONS
    target_precision: float = 0.95  # each configuration router's precision on held-out inputs (the seed: 94-96 %)
    gpu: str = "H100-80G"


class Prepared:
    """What every arm of one workload shares: the space, the trained router, the fixed
    configuration and the programs of each rate."""

    def __init__(self, setup: AragogSetup) -> None:
        self.setup = setup
        workload = get_workload(setup.workload)
        if not isinstance(workload, SpecWorkload):
            raise ValueError(f"workload {setup.workload!r} is not defined by a spec: it has no accuracy labels")
        self.workload = workload
        space = config_space(self.workload)
        if space is None:
            raise ValueError(f"workload {setup.workload!r} declares no model alternatives")
        self.space: ConfigSpace = space
        costs = model_costs(self.workload)
        self.groups = ModelGroups({GROUP: ModelGroup(GROUP, dict(sorted(costs.items(), key=lambda kv: kv[1])),
                                                     {space.workflow_type: GroupWorkflow(space)})})  # fmt: skip
        train = labelled_inputs(self.workload, setup.train_inputs, seed=setup.seed + 7_919)
        progress(f"{setup.workload}: training {space.size} configuration routers on {len(train)} inputs")
        self.router = ClassifierRouter.fit(
            space, [_labelled(x) for x in train], target_precision=setup.target_precision, seed=setup.seed
        )
        self.fixed = cheapest_matching(space, costs, train, setup.match_points)
        rng = np.random.default_rng(setup.seed)
        self.programs = [self.workload.instantiate(rng, f"wf-{i:05d}") for i in range(setup.workflows)]
        inputs = [p.input for p in self.programs if p.input is not None]
        calls = [c for p in self.programs for c in p.calls]
        # The context a decode attends over, on average: the prompt and half the output.
        self.context_tokens = int(sum(c.prompt_tokens + c.output_tokens / 2 for c in calls) / len(calls))
        self.precision, self.recall = precision_recall(self.router, space, [_labelled(x) for x in inputs])

    def arrivals(self, rate: float) -> list[tuple[float, WorkflowProgram]]:
        times = Poisson(rate).times(np.random.default_rng([self.setup.seed, 1]), count=len(self.programs))
        return [(float(t), p) for t, p in zip(times, self.programs, strict=True)]


def _labelled(x: WorkflowInput) -> LabelledInput:
    return LabelledInput(x.text, x.input_class, x.accurate)


def cheapest_matching(
    space: ConfigSpace, costs: Mapping[str, float], inputs: Sequence[WorkflowInput], points: float
) -> int:
    """The per-workflow configuration (§5.1): the cheapest whose accuracy on ``inputs`` is within
    ``points`` of the reference configuration's (ties: the lower index)."""
    accuracy = [sum(x.expected_accuracy(c) for x in inputs) / len(inputs) for c in range(space.size)]
    bar = accuracy[space.reference] - points / 100
    return min((c for c in range(space.size) if accuracy[c] >= bar), key=lambda c: (space.cost(c, costs), c))


def cluster(arm: str, gpu: str, max_num_seqs: int = 256) -> list[ReplicaSpec]:
    """§5.1's 8 GPUs: 32B on TP 4, 14B on TP 2, 7B on one GPU, and the router's GPU (a second 7B
    for the baselines, which have no router)."""
    counts = {"qwen2.5-32b": 1, "qwen2.5-14b": 1, "qwen2.5-7b": 2 if arm in BASELINES else 1}
    config = ExperimentConfig(workload="aragog", gpu=gpu, max_num_seqs=max_num_seqs)
    replicas = []
    for model, count in counts.items():
        for i in range(count):
            runner = EmulatedRunner(model, gpu, TENSOR_PARALLEL[model], sleep=_no_sleep, distinct_tokens=True)
            replicas.append(replica_spec(f"{model}-{i}", runner, config))
    return replicas


def engine_profiles(replicas: Sequence[ReplicaSpec], context_tokens: int, saturation: str = "knee") -> dict[str, EngineProfile]:
    """Each model's throughput-load curve from its cost model (decode tokens/s of one replica with
    ``b`` calls running, each attending over ``context_tokens``) up to its saturation batch, the
    replica's slots (§3.2: "the batch size ... beyond which throughput no longer improves").  Where
    that is depends on how flat "no longer" is (``SATURATIONS``):

    - ``knee``: the largest batch whose decode step takes at most 1.5 x the batch-1 step (the
      autoscaler's knee, ``sim/autoscaling.py``): past it a call's decode slows faster than the
      batch adds throughput;
    - ``flat``: the first batch at which one more call adds under 10 % of the batch-1 throughput.

    Both within the engine's ``max_num_seqs`` and its KV pool at that context."""
    if saturation not in SATURATIONS:
        raise ValueError(f"saturation must be one of {', '.join(SATURATIONS)}, got {saturation!r}")
    profiles: dict[str, EngineProfile] = {}
    for spec in replicas:
        model = spec.runner.info.name
        if model in profiles:
            continue
        cost = spec.runner.cost  # type: ignore[attr-defined]
        fits = min(spec.config.max_num_seqs, max(1, cost.kv_capacity_tokens() // (context_tokens + 1)))

        def step(batch: int, cost: Any = cost) -> float:
            return float(cost.step_cost([BatchItem(1, context_tokens)] * batch).seconds)

        curve = [0.0, 1 / step(1)]
        while len(curve) <= fits:
            batch = len(curve)
            if saturation == "knee" and step(batch) > KNEE_SLOWDOWN * step(1):
                break
            if saturation == "flat" and curve[-1] - curve[-2] < FLAT_GAIN * curve[1]:
                break
            curve.append(batch / step(batch))
        profiles[model] = EngineProfile(model, len(curve) - 1, tuple(curve))
    return profiles


def routing_policy(arm: str, prepared: Prepared, profiles: Mapping[str, EngineProfile]) -> RoutingPolicy:
    setup, wtype = prepared.setup, prepared.space.workflow_type
    oracle = KnownSetsRouter({p.input.text: p.input.accurate for p in prepared.programs if p.input is not None})
    if arm in ("aragog", "aragog-oracle"):
        router = prepared.router if arm == "aragog" else oracle
        return AragogRouting(groups=prepared.groups, routers={(GROUP, wtype): router}, profiles=profiles,
                             beam_width=setup.beam_width, router_call_s=setup.router_call_s)  # fmt: skip
    if arm == "aragog-per-input":
        return PerInputRouting(groups=prepared.groups, routers={(GROUP, wtype): oracle}, profiles=profiles)
    if arm == "aragog-per-workflow":
        return PerWorkflowRouting(groups=prepared.groups, fixed={(GROUP, wtype): prepared.fixed}, profiles=profiles)
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")


def run_arm(prepared: Prepared, arm: str, rate: float) -> dict[str, Any]:
    replicas = cluster(arm, prepared.setup.gpu)
    profiles = engine_profiles(replicas, prepared.context_tokens, prepared.setup.saturation)
    routing = routing_policy(arm, prepared, profiles)
    scheduler = GlobalScheduler(PRIORITY_POLICIES.create("fcfs"), routing, policy_name=arm, max_queue_per_model=10**9)
    sim = Simulator(replicas, arm, scheduler=scheduler, model_group=GROUP, seed=prepared.setup.seed)
    records = sim.run(prepared.arrivals(rate))
    return arm_metrics(prepared, records, routing)


def arm_metrics(prepared: Prepared, records: RunRecords, routing: RoutingPolicy) -> dict[str, Any]:
    done = [w for w in records.workflows if w.end_time is not None]
    jcts = [w.jct_s for w in done]
    models: dict[str, dict[str, str]] = defaultdict(dict)
    for call in sorted(records.calls, key=lambda c: c.dispatch_time or 0.0):
        if call.end_time is not None and not call.rejected:
            models[call.workflow_id][call.agent_id] = call.model
    space, inputs = prepared.space, {p.workflow_id: p.input for p in prepared.programs}
    correct = reference = 0.0
    used: dict[str, int] = defaultdict(int)
    for workflow_id, agents in models.items():
        label = inputs[workflow_id]
        assert label is not None
        chosen = dict(space.models(space.reference))
        chosen.update(agents)
        correct += label.expected_accuracy(space.config_of(chosen))
        reference += label.expected_accuracy(space.reference)
        for model in agents.values():
            used[model] += 1
    result: dict[str, Any] = {
        "workflows": len(done),
        "throughput_wps": steady_throughput(records),
        "p25_s": percentile(jcts, 25),
        "p50_s": percentile(jcts, 50),
        "p95_s": percentile(jcts, 95),
        "avg_s": float(np.mean(jcts)) if jcts else 0.0,
        "accuracy": correct / max(1, len(models)),
        "reference_accuracy": reference / max(1, len(models)),
        "agent_calls_by_model": dict(sorted(used.items())),
    }
    if isinstance(routing, StageScheduler):
        result["routing"] = routing.routing_stats()
    return result


def steady_throughput(records: RunRecords, warmup_share: float = 0.2) -> float:
    """Workflows completed per second while they still arrive, after the first ``warmup_share`` of
    arrivals (an empty cluster fills up first): the arrival rate when the cluster keeps up, its
    capacity when it does not."""
    arrivals = sorted(w.arrival_time for w in records.workflows)
    start, end = arrivals[int(len(arrivals) * warmup_share)], arrivals[-1]
    ended = sum(1 for w in records.workflows if w.end_time is not None and start <= w.end_time <= end)
    return ended / max(end - start, 1e-9)


_PREPARED: Prepared | None = None  # a forked worker's copy (``run_workload``)


def _run_forked(task: tuple[str, float]) -> dict[str, Any]:
    assert _PREPARED is not None
    return run_arm(_PREPARED, *task)


def run_workload(setup: AragogSetup, jobs: int = 1) -> dict[str, Any]:
    """Every arm at every rate on one workload's programs, ``jobs`` runs at a time (forked
    processes sharing the prepared programs and router)."""
    global _PREPARED
    prepared = _PREPARED = Prepared(setup)
    tasks = [(arm, rate) for arm in ARMS for rate in setup.rates]
    progress(f"{setup.workload}: {len(tasks)} runs of {setup.workflows} workflows, {jobs} at a time")
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            results = pool.map(_run_forked, tasks, chunksize=1)
    else:
        results = [run_arm(prepared, arm, rate) for arm, rate in tasks]
    return {
        "space_size": prepared.space.size,
        "context_tokens": prepared.context_tokens,
        "router_precision": prepared.precision,
        "router_recall": prepared.recall,
        "per_workflow_config": prepared.space.name(prepared.fixed),
        "runs": {f"{arm}@{rate:g}": result for (arm, rate), result in zip(tasks, results, strict=True)},
    }


def _gain(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f} %" if old else "n/a"


def _cut(new: float, old: float) -> str:
    return f"{(1 - new / old) * 100:+.1f} %" if old else "n/a"


@BENCHMARKS.register("aragog")
class AragogBench:
    help = "Aragog vs per-input and per-workflow configuration selection, on 8 simulated H100s (seeds/002 §5)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
        parser.add_argument("--rates", default="", help="workflows/s, comma-separated (default: per workload)")
        parser.add_argument("--workflows", type=int, default=1500, help="workflows per run")
        parser.add_argument("--train-inputs", type=int, default=2000, help="labelled inputs the routers learn from")
        parser.add_argument("--target-precision", type=float, default=0.95,
                            help="each configuration router's precision on held-out inputs")  # fmt: skip
        parser.add_argument("--saturation", choices=SATURATIONS, default="knee",
                            help="how a replica's slots are profiled (see engine_profiles)")  # fmt: skip
        parser.add_argument("--beam-width", type=int, default=4)
        parser.add_argument("--router-call-ms", type=float, default=DEFAULT_ROUTER_CALL_MS,
                            help="virtual time of one router call")  # fmt: skip
        parser.add_argument("--match-points", type=float, default=1.0,
                            help="per-workflow: accuracy within this many points of the reference's")  # fmt: skip
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
        parser.add_argument("--quick", action="store_true", help="300 workflows, the top two rates, 500 training inputs")

    def run(self, args: argparse.Namespace) -> BenchResult:
        rows: list[list[Any]] = []
        summary: dict[str, Any] = {}
        details: dict[str, Any] = {}
        for workload in [w for w in args.workloads.split(",") if w]:
            if workload not in DEFAULT_RATES:
                raise SystemExit(f"aragog: {workload!r} has no accuracy labels; choose from {', '.join(WORKLOADS)}")
            rates = tuple(float(r) for r in args.rates.split(",") if r) or DEFAULT_RATES[workload]
            workflows, train = args.workflows, args.train_inputs
            if args.quick:
                rates, workflows, train = rates[-2:], 300, 500
            setup = AragogSetup(
                workload, rates, workflows=workflows, seed=args.seed, train_inputs=train, beam_width=args.beam_width,
                router_call_s=args.router_call_ms / 1e3, match_points=args.match_points, saturation=args.saturation,
                target_precision=args.target_precision,
            )  # fmt: skip
            result = details[workload] = run_workload(setup, jobs=max(1, args.jobs))
            runs, peak = result["runs"], max(rates)
            best = {arm: max(runs[f"{arm}@{r:g}"]["throughput_wps"] for r in rates) for arm in ARMS}
            for arm in ARMS:
                at_peak = runs[f"{arm}@{peak:g}"]
                rows.append([workload, arm, best[arm], at_peak["p25_s"], at_peak["p50_s"], at_peak["p95_s"],
                             at_peak["accuracy"] * 100,
                             (at_peak["accuracy"] - at_peak["reference_accuracy"]) * 100])  # fmt: skip
            aragog, per_input, per_workflow = (runs[f"{arm}@{peak:g}"] for arm in ("aragog", *BASELINES))
            summary[workload] = {
                "max throughput vs per-input": _gain(best["aragog"], best["aragog-per-input"]),
                "max throughput vs per-workflow": _gain(best["aragog"], best["aragog-per-workflow"]),
                "P25/P50/P95 at peak vs per-input": " / ".join(
                    _cut(aragog[k], per_input[k]) for k in ("p25_s", "p50_s", "p95_s")),
                "P25/P50/P95 at peak vs per-workflow": " / ".join(
                    _cut(aragog[k], per_workflow[k]) for k in ("p25_s", "p50_s", "p95_s")),
                "router precision / recall": f"{result['router_precision']:.3f} / {result['router_recall']:.3f}",
                "routing at the lowest and highest rate": [runs[f"aragog@{r:g}"].get("routing", {}) for r in (min(rates), peak)],
            }  # fmt: skip
        return BenchResult(
            name="aragog",
            columns=["workload", "arm", "max wf/s", "P25 s @peak", "P50 s @peak", "P95 s @peak", "accuracy %",
                     "vs all-largest (points)"],  # fmt: skip
            rows=rows,
            summary=summary,
            params={**{k: v for k, v in vars(args).items() if k not in ("func", "out_dir")}, "details": details},
        )
