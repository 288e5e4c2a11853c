"""One experiment = a workload instance, an arrival process and a cluster, run under one preset.

``compare`` runs every preset on the *same* instance: the same seed gives the same programs
(lengths, fan-outs, tool latencies) and the same arrival times, so differences are the policy's.

Cluster placement (a choice; the seeds each fix their own): the GPUs are shared equally among the
workload's served models; each replica of a model uses the smallest tensor-parallel degree in
(1, 2, 4, 8) whose KV pool holds at least one full-context request (``min(max_model_len, 32K)``
tokens), as a serving operator would size it.  With ``placement = "auto"`` (sim/placement.py)
each model's replicas and degree follow the work programs drawn apart from the measured instance
bring it, priced at the batch the config's load gives (``workflows_in_flight``).

Autoscaling (``scaling``, a registered scaling policy; None: the fixed cluster above, as ever):
the policy's core ticks every ``scale_interval_s`` virtual seconds (sim/autoscaling.py) within
``gpu_budget`` GPUs (default: ``gpus``).  The run starts from the fixed placement for ``gpus``
trimmed to the budget (``fitting_counts``: round-robin over the models in name order, so each
model keeps a first replica before any keeps a second while they fit), its replicas ready at 0.

Annotations (``annotations``): none (the default), the profiler core trained on a warm-up instance
of ``warmup_workflows`` workflows (same workload and arrival process, other seed and ids, run
under fcfs-rr) and then online, or the generator's ground truth (sim/annotations.py).  ``compare``
trains the profiler once and gives every preset its own copy of the trained state, so each preset
starts from the same profile, as if each had run its own identical warm-up.

KV tiers (``host_cache``, ``l3``; off by default, and then absent from a results file's config):
each replica gets an L2 host pool of ``host_cache`` (``auto``: half its GPU's share of the node's
DRAM, ``EmulatedRunner.default_num_host_blocks``; else GB per GPU), and with ``l3 = "memory"`` all
replicas of a run share one ``MemoryL3`` of ``l3_capacity_gb``, counted in pages of the largest
served model (a whole replica's KV of one block), so the store never holds more than that.

A cache manager (``cache_policy``, a registered cache policy; None: none, as ever, and the key is
absent from a results file's config): one for the run's replicas, its messages delayed as
``CacheManagerDelays`` says (sim/cache_manager.py); the results get a ``cache_manager`` entry.
``l1_fraction`` < 1 cuts each replica's device pool to that share (absent from the file at 1), so
that a run small enough to be quick still has its contexts contend for L1.

Own stacks (``own_stacks``): each preset runs with the cache policy and scaling policy its preset
names (``Preset.cache``, ``Preset.scaling``; ``stack_config``), as its paper ran it, over the
config's tiers and GPU budget; each result then says which (``stack``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from clairvoyant.bench.arrivals import ClosedLoop, Poisson, parse_arrivals
from clairvoyant.bench.metrics import global_queue_by_model, jct_list, queue_depth_series, summarize
from clairvoyant.bench.parallel import ProgressCallback, SimTask, run_tasks
from clairvoyant.bench.records import RunRecords
from clairvoyant.bench.sim.annotations import OracleAnnotator, ProfilerAnnotator, warm_up
from clairvoyant.bench.sim.autoscaling import SimAutoscaler, fitting_counts, model_profile
from clairvoyant.bench.sim.cache_results import cache_metrics
from clairvoyant.bench.sim.lower_bound import (
    CapacityBounds,
    PeakWork,
    RooflineServiceTime,
    ServiceTime,
    capacity_bound,
)
from clairvoyant.bench.sim.placement import (
    EfficientBatch,
    Placement,
    mean_critical_path,
    place,
    predicted_demand,
)
from clairvoyant.bench.sim.simulator import Annotator, ReplicaSpec, SimProgress, Simulator
from clairvoyant.bench.workloads import Workload, get_workload
from clairvoyant.policy.admission import KneeAdmission, KneeConfig
from clairvoyant.policy.cache import CACHE_POLICIES
from clairvoyant.policy.capabilities import Capability, capabilities_of
from clairvoyant.policy.presets import PRESETS, build_policies
from clairvoyant.policy.scaling import SCALING_POLICIES, ModelProfile
from clairvoyant.profiler.core import ProfileConfig, ProfileStore
from clairvoyant.profiler.core.remaining import RemainingConfig
from clairvoyant.scheduler.core import GlobalScheduler
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.core.l3 import L3Store, MemoryL3
from clairvoyant.worker.core.tiers import WRITE_POLICIES, TierConfig, WritePolicy
from clairvoyant.worker.costmodel.gpus import GB
from clairvoyant.worker.costmodel.roofline import BatchItem
from clairvoyant.worker.runners.emulated import EmulatedRunner
from clairvoyant.workloads.program import WorkflowProgram

TP_CHOICES = (1, 2, 4, 8)
QUEUE_SERIES_POINTS = 500  # per model, in the results file


@dataclass(frozen=True)
class ExperimentConfig:
    workload: str
    gpus: int = 8
    gpu: str = "H100-80G"
    workflows: int = 64
    rate: float | None = None  # workflows/s (Poisson); None with concurrency None: all at t=0
    concurrency: int | None = None  # closed loop
    arrivals: str | None = None  # an arrival process as text (``arrivals.parse_arrivals``), instead of rate
    seed: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    annotations: str = "none"  # none | profiler | profiler-path (no remaining-work model) | oracle
    warmup_workflows: int = 64  # profiler annotations: the warm-up instance's size (0: learn online only)
    scaling: str | None = None  # a registered scaling policy; None: fixed replicas
    gpu_budget: int | None = None  # scaling: GPUs the replicas may hold at once (None: gpus)
    scale_interval_s: float = 5.0  # scaling: virtual seconds between the policy's ticks
    host_cache: str = "0"  # L2 per replica: "0" (none), "auto", or GB per GPU
    l3: str = "none"  # none | memory (one store shared by the run's replicas; needs an L2)
    l3_capacity_gb: float = 1000.0  # the shared store's capacity
    l3_write_policy: WritePolicy = "write_through"
    cache_policy: str | None = None  # a registered cache policy: the run has a cache manager
    l1_fraction: float = 1.0  # of each replica's device KV pool (< 1: contexts contend for L1 in a small run)
    placement: str = "equal"  # equal | auto (sim/placement.py: replicas follow the predicted work)
    # The knee's throughput share φ for a preset that admits at the knee (policy/admission.py);
    # None: the preset's own (0.7).  Refused for a preset that does not.
    knee_fraction: float | None = None
    knee_displace: bool = False  # ... and whether an urgent call may displace one beyond the knee
    # Each preset with its own cache policy and scaling policy (``Preset.cache``/``.scaling``), as
    # its paper ran it, instead of the config's (``stack_config``).
    own_stacks: bool = False


SCALING_KEYS = ("scaling", "gpu_budget", "scale_interval_s")  # in a results file only with scaling on
TIER_KEYS = ("host_cache", "l3", "l3_capacity_gb", "l3_write_policy")  # only with an L2
L3_KINDS = ("none", "memory")
# In a results file only when not these.
DEFAULT_LEFT_OUT = {"cache_policy": None, "l1_fraction": 1.0, "placement": "equal", "own_stacks": False}


def tiers_on(config: ExperimentConfig) -> bool:
    """Whether the replicas have an L2 (and so the run's config has the tier keys)."""
    return host_cache_gb(config.host_cache) != 0


def host_cache_gb(text: str) -> float | None:
    """``host_cache`` as GB per GPU; None for ``auto``.  ValueError for anything else."""
    if text.strip().lower() == "auto":
        return None
    try:
        gb = float(text)
    except ValueError:
        raise ValueError(f"host cache must be 'auto' or GB per GPU, got {text!r}") from None
    if not gb >= 0:
        raise ValueError(f"host cache must be >= 0 GB, got {text!r}")
    return gb


def check_tiers(config: ExperimentConfig) -> None:
    """Raise ValueError for a bad host cache size, L3 kind, capacity, write policy or cache policy."""
    host_cache_gb(config.host_cache)
    if config.l3 not in L3_KINDS:
        raise ValueError(f"unknown l3 {config.l3!r}; choose from {', '.join(L3_KINDS)}")
    if config.l3 != "none" and not tiers_on(config):
        raise ValueError("an L3 store needs an L2 host pool: give a host cache size")
    if config.cache_policy is not None and config.cache_policy not in CACHE_POLICIES.names():
        raise ValueError(
            f"unknown cache policy {config.cache_policy!r}; choose from {', '.join(CACHE_POLICIES.names())}"
        )
    if not 0 < config.l1_fraction <= 1:
        raise ValueError(f"l1_fraction must be in (0, 1], got {config.l1_fraction}")
    if not config.l3_capacity_gb > 0:
        raise ValueError(f"l3 capacity must be > 0 GB, got {config.l3_capacity_gb}")
    if config.l3_write_policy not in WRITE_POLICIES:
        raise ValueError(f"unknown L3 write policy {config.l3_write_policy!r}; choose from {', '.join(WRITE_POLICIES)}")


def host_blocks(runner: EmulatedRunner, config: ExperimentConfig) -> int:
    """The L2 pool of a replica over ``runner``, in blocks (0: none)."""
    if not tiers_on(config):
        return 0
    gb = host_cache_gb(config.host_cache)
    if gb is None:
        return runner.default_num_host_blocks(config.block_size)
    return max(1, int(gb * GB // (runner.kv_bytes_per_token() * config.block_size)))


def check_scaling(config: ExperimentConfig) -> None:
    """Raise ValueError for an unknown scaling policy or a non-positive budget or interval."""
    if config.scaling is None:
        return
    if config.scaling not in SCALING_POLICIES:
        raise ValueError(f"unknown scaling policy {config.scaling!r}; choose from {SCALING_POLICIES.names()}")
    if config.gpu_budget is not None and config.gpu_budget < 1:
        raise ValueError(f"gpu_budget must be at least 1, got {config.gpu_budget}")
    if config.scale_interval_s <= 0:
        raise ValueError(f"scale_interval_s must be positive, got {config.scale_interval_s}")


def _no_sleep(seconds: float) -> None:
    del seconds  # virtual time: the simulator moves the clock


MIN_KV_TOKENS = 32_768


def _runner_at(model: str, gpu: str, tp: int) -> EmulatedRunner | None:
    """A replica of ``model`` over ``tp`` GPUs, or None where it does not hold a full-context request."""
    try:
        runner = EmulatedRunner(model, gpu, tp, sleep=_no_sleep, distinct_tokens=True)
    except ValueError:
        return None
    if runner.cost.kv_capacity_tokens(runner.gpu_mem_util) >= min(runner.info.max_model_len, MIN_KV_TOKENS):
        return runner
    return None


def _runner(model: str, gpu: str) -> tuple[EmulatedRunner, int]:
    for tp in TP_CHOICES:
        runner = _runner_at(model, gpu, tp)
        if runner is not None:
            return runner, tp
    raise ValueError(f"{model} does not fit 8 x {gpu} with room for a full-context request")


def replica_spec(
    replica_id: str, runner: EmulatedRunner, config: ExperimentConfig, l3: L3Store | None = None
) -> ReplicaSpec:
    """One replica over ``runner``, its engine sized by ``config``; ``l3``: the run's shared store."""
    tiers = TierConfig(num_host_blocks=host_blocks(runner, config), write_policy=config.l3_write_policy)
    engine = EngineConfig(
        block_size=config.block_size,
        num_blocks=max(1, int((runner.default_num_blocks(config.block_size) or 1024) * config.l1_fraction)),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        tiers=tiers,
    )
    return ReplicaSpec(replica_id, runner, engine, l3=l3 if tiers.num_host_blocks else None)


def shared_l3(runners: list[EmulatedRunner], config: ExperimentConfig) -> L3Store | None:
    """The run's L3 store (None without one), in pages of the largest served model's block."""
    if config.l3 == "none" or not runners:
        return None
    page_bytes = max(runner.cost.kv_bytes(config.block_size) for runner in runners)
    return MemoryL3(capacity_pages=max(1, int(config.l3_capacity_gb * GB // page_bytes)))


def _equal_placement(workload: Workload, config: ExperimentConfig) -> Placement:
    """Each model an equal share of ``gpus`` at its smallest fitting degree; with scaling, trimmed."""
    models = workload.served_models()
    share = max(1, config.gpus // len(models))
    tps = {model: _runner(model, config.gpu)[1] for model in models}
    counts = {model: max(1, share // tp) for model, tp in tps.items()}
    if config.scaling is not None:
        counts = fitting_counts(counts, tps, budget_of(config))
    return Placement(counts, tps, dict.fromkeys(models, 0.0))


def _auto_placement(workload: Workload, config: ExperimentConfig) -> Placement:
    """``placement.place`` on the work of ``PLACEMENT_PROGRAMS`` programs drawn apart from the
    measured instance, within ``gpus`` (and the scaling budget).  With scaling, each model keeps
    its smallest fitting degree, the one the autoscaler's new replicas have.  The batches are
    priced at the load's workflows in flight (``workflows_in_flight``)."""
    rng = np.random.default_rng([config.seed, 3])
    programs = [workload.instantiate(rng, f"placement-{i}") for i in range(PLACEMENT_PROGRAMS)]
    shapes: dict[str, list[EfficientBatch]] = {}
    for model in workload.served_models():
        degrees = TP_CHOICES if config.scaling is None else (_runner(model, config.gpu)[1],)
        runners = [runner for tp in degrees if (runner := _runner_at(model, config.gpu, tp)) is not None]
        if not runners:
            raise ValueError(f"{model} does not fit 8 x {config.gpu} with room for a full-context request")
        shapes[model] = [_efficient_batch(runner, config) for runner in runners]
    budget = min(config.gpus, budget_of(config))
    in_flight = workflows_in_flight(config, mean_critical_path(programs, shapes))
    return place(predicted_demand(programs, shapes, workflows_in_flight=in_flight, max_replicas=budget), budget)


def workflows_in_flight(config: ExperimentConfig, mean_path_s: float) -> float | None:
    """Workflows running at once under the config's load, as placement prices batches: the
    closed loop's concurrency; Poisson: rate x the mean critical path (Little's law with no
    queueing); all at t = 0: half of them (the mean over the burst's drain); another arrival
    process: None (the knee)."""
    if config.concurrency:
        return float(min(config.concurrency, config.workflows))
    if config.rate:
        return config.rate * mean_path_s
    if config.arrivals:
        return None
    return config.workflows / 2


def _efficient_batch(runner: EmulatedRunner, config: ExperimentConfig) -> EfficientBatch:
    chunk = config.max_num_batched_tokens
    return EfficientBatch(
        runner.cost, seats=config.max_num_seqs,
        kv_tokens=int(runner.cost.kv_capacity_tokens(runner.gpu_mem_util) * config.l1_fraction),
        prefill_tokens_per_s=chunk / runner.cost.step_cost([BatchItem(chunk, 0)]).seconds,
    )  # fmt: skip


PLACEMENTS: dict[str, Callable[[Workload, ExperimentConfig], Placement]] = {
    "equal": _equal_placement,
    "auto": _auto_placement,
}
PLACEMENT_PROGRAMS = 64  # programs drawn (their own seed) to predict each model's work


def plan_placement(workload: Workload, config: ExperimentConfig) -> Placement:
    """The replicas and degree of each model that ``config.placement`` gives (ValueError: unknown)."""
    if config.placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {config.placement!r}; choose from {', '.join(PLACEMENTS)}")
    return PLACEMENTS[config.placement](workload, config)


def build_cluster(workload: Workload, config: ExperimentConfig) -> tuple[list[ReplicaSpec], dict[str, ServiceTime]]:
    """The fixed placement (see the module docstring); with scaling, trimmed to the budget."""
    placement = plan_placement(workload, config)
    probes = {model: _runner_at(model, config.gpu, tp) for model, tp in placement.tp.items()}
    replicas: list[ReplicaSpec] = []
    service: dict[str, ServiceTime] = {}
    l3 = shared_l3([runner for runner in probes.values() if runner is not None], config)
    for model in workload.served_models():
        probe = probes[model]
        assert probe is not None  # placement only gives degrees that fit
        service[model] = RooflineServiceTime(probe.cost)
        for i in range(placement.replicas[model]):
            runner = probe if i == 0 else _runner_at(model, config.gpu, placement.tp[model])
            assert runner is not None
            replicas.append(replica_spec(f"{model}-{i}", runner, config, l3))
    return replicas, service


def budget_of(config: ExperimentConfig) -> int:
    return config.gpus if config.gpu_budget is None else config.gpu_budget


def model_profiles(workload: Workload, config: ExperimentConfig) -> dict[str, ModelProfile]:
    """Each served model's ``ModelProfile`` from its emulated runner's cost model."""
    profiles = {}
    for model in workload.served_models():
        runner, _ = _runner(model, config.gpu)
        profiles[model] = model_profile(
            model, runner.cost, kv_capacity_tokens=runner.cost.kv_capacity_tokens(runner.gpu_mem_util),
            max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        )  # fmt: skip
    return profiles


AGENT_MODEL_SAMPLES = 32  # programs drawn (their own seed) to learn which model serves each agent


def agent_models(workload: Workload, config: ExperimentConfig) -> dict[tuple[str, str], str]:
    """(workflow type, agent) -> model, as a trained profiler knows it: from programs of the
    workload drawn apart from the measured instance."""
    rng = np.random.default_rng([config.seed, 2])
    found: dict[tuple[str, str], str] = {}
    for i in range(AGENT_MODEL_SAMPLES):
        program = workload.instantiate(rng, f"agents-{i}")
        for call in program.calls:
            found.setdefault((program.workflow_type, call.agent_id), call.model)
    return found


def _autoscaler(
    simulator: Simulator, workload: Workload, config: ExperimentConfig, l3: L3Store | None
) -> SimAutoscaler:
    assert config.scaling is not None
    profiles = model_profiles(workload, config)

    def new_replica(model: str, replica_id: str) -> ReplicaSpec:
        return replica_spec(replica_id, _runner(model, config.gpu)[0], config, l3)

    return SimAutoscaler(
        simulator, SCALING_POLICIES.create(config.scaling), profiles, budget_of(config), new_replica,
        interval_s=config.scale_interval_s, agent_models=agent_models(workload, config),
    )  # fmt: skip


def instance(
    workload: Workload, config: ExperimentConfig, prefix: str = "wf"
) -> tuple[list[tuple[float, WorkflowProgram]], list[WorkflowProgram]]:
    """(initial arrivals, closed-loop backlog): identical for every preset given the seed.
    Raises ValueError for a config giving more than one of rate, concurrency and arrivals."""
    given = [name for name in ("rate", "concurrency", "arrivals") if getattr(config, name)]
    if len(given) > 1:
        raise ValueError(f"give at most one of rate, concurrency and arrivals, got {' and '.join(given)}")
    rng = np.random.default_rng(config.seed)
    programs = [workload.instantiate(rng, f"{prefix}-{i:05d}") for i in range(config.workflows)]
    arrival_rng = np.random.default_rng([config.seed, 1])
    if config.arrivals:
        times = parse_arrivals(config.arrivals).times(arrival_rng, count=len(programs))
        return [(float(t), p) for t, p in zip(times, programs, strict=True)], []
    if config.concurrency:
        initial = len(ClosedLoop(config.concurrency).times(arrival_rng, count=len(programs)))
        return [(0.0, p) for p in programs[:initial]], programs[initial:]
    if config.rate:
        times = Poisson(config.rate).times(arrival_rng, count=len(programs))
        return [(float(t), p) for t, p in zip(times, programs, strict=True)], []
    return [(0.0, p) for p in programs], []


WARMUP_SEED_OFFSET = 1_000_000  # the warm-up instance's seed: config.seed + this


def _profiler_annotator(
    workload: Workload, config: ExperimentConfig, service: Mapping[str, ServiceTime], path_only: bool = False
) -> Annotator:
    store = None
    if path_only:  # the profiler as it predicted before its remaining-work model (for comparison)
        store = ProfileStore(ProfileConfig(remaining=RemainingConfig(enabled=False)))
    annotator = ProfilerAnnotator(store)
    if config.warmup_workflows > 0:
        warm = dataclasses.replace(config, workflows=config.warmup_workflows, seed=config.seed + WARMUP_SEED_OFFSET)
        arrivals, backlog = instance(workload, warm, prefix="warmup")
        # The profile is the workflows' shape, not the cluster's: a cut L1 would only slow the warm-up.
        cluster = build_cluster(workload, dataclasses.replace(config, l1_fraction=1.0))[0]
        warm_up(annotator, cluster, arrivals, backlog=backlog, seed=warm.seed)
    return annotator


ANNOTATORS: dict[str, Callable[[Workload, ExperimentConfig, Mapping[str, ServiceTime]], Annotator | None]] = {
    "none": lambda workload, config, service: None,
    "profiler": _profiler_annotator,
    "profiler-path": lambda workload, config, service: _profiler_annotator(workload, config, service, True),
    "oracle": lambda workload, config, service: OracleAnnotator(service),
}


SERVED_TIERS = ("low", "high")  # the profiler tiers whose paths and remaining times presets read


def warmup_summary(annotator: Annotator | None, config: ExperimentConfig) -> dict[str, Any] | None:
    """What the profiler learnt on the warm-up instance: its size and each workflow type's
    confidence tier (``tiers``), and the types still unconverged (``unserved``). Those are served
    output lengths only, so presets that read paths or remaining time rank their calls on their
    reactive tier, and compare much as without a profiler: raise ``warmup_workflows``.  None for an
    annotator other than the profiler's."""
    if not isinstance(annotator, ProfilerAnnotator):
        return None
    tiers = annotator.tiers()
    unserved = sorted(wt for wt, tier in tiers.items() if tier not in SERVED_TIERS)
    return {"workflows": config.warmup_workflows, "tiers": tiers, "unserved": unserved}


def warmup_warning(warmup: dict[str, Any] | None) -> str | None:
    """A line for the operator when the warm-up left a workflow type unserved, else None."""
    if warmup is None or not warmup["unserved"]:
        return None  # no profiler, every type served, or no warm-up (learning online only, by choice)
    types = ", ".join(f"{wt} ({warmup['tiers'][wt]})" for wt in warmup["unserved"])
    return (f"warning: after a warm-up of {warmup['workflows']} workflows the profile of {types} has not "
            "converged: only output lengths are served, and presets that read paths or remaining time "
            "rank its calls on their reactive tier; raise --warmup-workflows (a burst of coding_assistant "
            "needs about 192)")  # fmt: skip


def make_annotator(config: ExperimentConfig) -> Annotator | None:
    """The annotator ``config.annotations`` names, ready for a measured run (the profiler: trained
    on the warm-up instance)."""
    if config.annotations not in ANNOTATORS:
        raise ValueError(f"unknown annotations {config.annotations!r}; choose from {sorted(ANNOTATORS)}")
    workload = get_workload(config.workload)
    return ANNOTATORS[config.annotations](workload, config, build_cluster(workload, config)[1])


def sim_scheduler(policy: str, config: ExperimentConfig) -> GlobalScheduler | None:
    """The run's scheduler when the config sets a policy parameter (the knee's φ, displacement);
    None: the preset's own.  Raises ValueError for a knee fraction given to a preset that has no knee."""
    if config.knee_fraction is None and not config.knee_displace:
        return None
    priority, routing = build_policies(policy)
    if Capability.ADMITS not in capabilities_of(routing):
        raise ValueError(f"--knee-fraction needs a preset that admits at the knee; {policy!r} does not")
    fraction = KneeConfig().throughput_fraction if config.knee_fraction is None else config.knee_fraction
    cast(KneeAdmission, routing).knee = KneeConfig(fraction, displace=config.knee_displace)
    return GlobalScheduler(priority, routing, policy_name=policy, max_queue_per_model=1_000_000)


def stack_config(config: ExperimentConfig, policy: str) -> ExperimentConfig:
    """The config ``policy`` runs under: with ``own_stacks``, its preset's cache policy (a cache
    manager over the config's tiers) and scaling policy (``static``: fixed replicas), else the
    config as given."""
    if not config.own_stacks:
        return config
    preset = PRESETS.create(policy)
    scaling = None if preset.scaling == "static" else preset.scaling
    return dataclasses.replace(config, cache_policy=preset.cache, scaling=scaling)


def run_sim(
    config: ExperimentConfig,
    policy: str,
    annotator: Annotator | None = None,
    progress: Callable[[SimProgress], None] | None = None,
) -> dict[str, Any]:
    """One preset on the config's instance.  ``annotator``: a prepared one (``make_annotator``),
    copied so the caller's stays untouched for the next preset; None: prepare one here.
    ``progress``: called as the run goes (``Simulator.run``)."""
    config = stack_config(config, policy)
    workload = get_workload(config.workload)
    if config.annotations not in ANNOTATORS:
        raise ValueError(f"unknown annotations {config.annotations!r}; choose from {sorted(ANNOTATORS)}")
    check_scaling(config)
    check_tiers(config)
    replicas, service = build_cluster(workload, config)
    arrivals, backlog = instance(workload, config)
    if annotator is None:
        annotator = ANNOTATORS[config.annotations](workload, config, service)
    else:
        annotator = copy.deepcopy(annotator)
    started = time.perf_counter()
    simulator = Simulator(replicas, policy, seed=config.seed, service_times=service, annotator=annotator,
                          cache_policy=config.cache_policy, scheduler=sim_scheduler(policy, config))  # fmt: skip
    l3 = next((spec.l3 for spec in replicas), None)
    autoscaler = _autoscaler(simulator, workload, config, l3) if config.scaling is not None else None
    records = simulator.run(arrivals, backlog=backlog, progress=progress)
    bounds = run_capacity_bound(records, [*(p for _, p in arrivals), *backlog], replicas, config)
    records.capacity_bound_avg_jct_s, records.limit_avg_jct_s = bounds
    result = summarize(records)
    result["virtual_seconds"] = records.duration_s
    result["wall_seconds"] = time.perf_counter() - started
    result["replicas"] = {spec.worker_id: spec.runner.info.extra.get("tensor_parallel", "1") for spec in replicas}
    if config.placement != "equal":  # the equal split's files read as they always have
        result["placement"] = plan_placement(workload, config).summary()
    # For the plots (``python -m clairvoyant.bench plot``): the JCT CDF and queue depth over time.
    result["jct_s"] = jct_list(records)
    result["queue_depth_series"] = queue_depth_series(records, points=QUEUE_SERIES_POINTS)
    if autoscaler is not None:
        result["scaling"] = config.scaling
        result["autoscaling"] = autoscaler.finish(simulator.events.now).summary()
        result["global_queue_s_by_model"] = global_queue_by_model(records)
    if records.cache_manager is not None:
        result["cache_manager"] = cache_metrics(records)
    if config.own_stacks:
        result["stack"] = {"cache": config.cache_policy, "scaling": config.scaling or "static"}
    return result


def run_capacity_bound(
    records: RunRecords,
    programs: list[WorkflowProgram],
    replicas: list[ReplicaSpec],
    config: ExperimentConfig,
) -> CapacityBounds:
    """``lower_bound.capacity_bound`` of the run's finished workflows at their arrivals, with their
    critical paths, the larger under either sharing of a step's fixed cost (``PeakWork``): per
    model too when the cluster is fixed; with scaling, on the budget alone."""
    by_id = {program.workflow_id: program for program in programs}
    finished = [w for w in records.workflows if w.end_time is not None]
    done = [(w.arrival_time, by_id[w.workflow_id]) for w in finished]
    paths = [w.lower_bound_s for w in finished]
    shapes: dict[str, ReplicaSpec] = {}
    gpus_by_model: dict[str, int] = {}
    for spec in replicas:
        assert isinstance(spec.runner, EmulatedRunner)  # build_cluster's replicas are all emulated
        model = spec.runner.info.name
        if model not in shapes or spec.config.num_blocks > shapes[model].config.num_blocks:
            shapes[model] = spec  # the largest pool charges the least: still a bound
        gpus_by_model[model] = gpus_by_model.get(model, 0) + spec.runner.cost.tp
    for model in {call.model for _, program in done for call in program.calls} - set(shapes):
        shapes[model] = replica_spec(model, _runner(model, config.gpu)[0], config)  # none at the start
    fixed = config.scaling is None
    bounds = [
        capacity_bound(
            done, {model: _peak_work(spec, sharing) for model, spec in shapes.items()},
            total_gpus=sum(gpus_by_model.values()) if fixed else budget_of(config),
            gpus_by_model=gpus_by_model if fixed else None, critical_paths=paths,
        )  # fmt: skip
        for sharing in ("seat", "kv")
    ]
    return CapacityBounds(max(b.capacity_s for b in bounds), max(b.limit_s for b in bounds))


def _peak_work(spec: ReplicaSpec, sharing: str) -> PeakWork:
    assert isinstance(spec.runner, EmulatedRunner)
    if sharing == "seat":
        return PeakWork.per_seat(spec.runner.cost, spec.config.max_num_seqs)
    return PeakWork.per_kv_token(spec.runner.cost, spec.config.num_blocks * spec.config.block_size)


def compare(
    config: ExperimentConfig,
    policies: list[str],
    *,
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
    on_warmup: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every policy in the simulator, ``jobs`` runs at a time (parallel.py; the results do not
    depend on it), ``on_progress`` called with (index in ``policies``, where that run stands),
    ``on_warmup`` with the profiler's ``warmup_summary`` before the first run.
    The live counterpart is ``live.run.compare_live``."""
    check_scaling(config)
    check_tiers(config)
    started = time.perf_counter()
    prepared, warmup = _prepared_annotator(config, on_warmup)
    tasks = [SimTask(config, policy, prepared, run_sim) for policy in policies]
    results = dict(zip(policies, run_tasks(tasks, jobs, on_progress), strict=True))
    return compare_result(config, "sim", results, time.perf_counter() - started, warmup)


def _prepared_annotator(
    config: ExperimentConfig, on_warmup: Callable[[dict[str, Any]], None] | None
) -> tuple[Annotator | None, dict[str, Any] | None]:
    """``make_annotator`` and its ``warmup_summary``, which ``on_warmup`` is given before any run starts."""
    prepared = make_annotator(config)
    warmup = warmup_summary(prepared, config)
    if warmup is not None and on_warmup is not None:
        on_warmup(warmup)
    return prepared, warmup


def compare_result(
    config: ExperimentConfig,
    mode: str,
    results: dict[str, Any],
    wall_seconds: float,
    warmup: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A compare results file: the instance's identity, every policy's metrics and, with the
    profiler's annotations, what its warm-up left (``warmup_summary``)."""
    file = {
        "workload": config.workload,
        "mode": mode,
        "seed": config.seed,
        "wall_seconds": wall_seconds,
        "config": config_dict(config),
        "policies": results,
    }
    if warmup is not None:
        file["warmup"] = warmup
    return file


def config_dict(config: ExperimentConfig) -> dict[str, Any]:
    """The config as a results file holds it: without the scaling keys when scaling is off, nor
    the tier keys when there is no L2 (the files of earlier runs read as they always have)."""
    left_out = (() if config.scaling is not None else SCALING_KEYS) + (() if tiers_on(config) else TIER_KEYS)
    left_out += tuple(key for key, default in DEFAULT_LEFT_OUT.items() if getattr(config, key) == default)
    return {k: v for k, v in vars(config).items() if k not in left_out}


def scale_compare(
    config: ExperimentConfig,
    scalings: list[str],
    preset: str,
    *,
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
    on_warmup: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One scheduling ``preset`` under each scaling policy, on the same instance; the file is a
    compare file whose entries are named by scaling policy (each one's config has its ``scaling``)."""
    started = time.perf_counter()
    configs = [dataclasses.replace(config, scaling=scaling) for scaling in scalings]
    for each in configs:
        check_scaling(each)
    prepared, warmup = _prepared_annotator(config, on_warmup)
    tasks = [SimTask(each, preset, prepared, run_sim) for each in configs]
    results = dict(zip(scalings, run_tasks(tasks, jobs, on_progress), strict=True))
    for result in results.values():
        result["preset"] = preset
    first = dataclasses.replace(config, scaling=scalings[0])
    file = compare_result(first, "sim", results, time.perf_counter() - started, warmup)
    file["kind"] = "scale-compare"
    file["preset"] = preset
    file["config"]["scaling"] = None  # it varies: each entry says its own
    return file
