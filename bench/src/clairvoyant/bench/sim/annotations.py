"""Annotations in the simulator: what the profiler would attach to each call (``SysAnnotations``).

The annotators here implement the simulator's ``Annotator`` protocol:

    call ready ──annotate──> QueuedRequest.annotations ──> scheduler and cache policies
    call done  ──observe───> the annotator learns (ProfilerAnnotator) or forgets (OracleAnnotator)

- ``ProfilerAnnotator``: the profiler's pure core (``ProfileStore``) trained online on the
  simulated completion records (with their block-hash chains), as the live profiler is on
  ``cv.requests.completed``.  ``warm_up`` first trains it on a separate instance of the same
  workload, so that the measured run starts from a profile learnt from traffic, not from the
  generator's ground truth.
- ``OracleAnnotator``: the generator's ground truth (the ``WorkflowProgram``), for ablations:
  exact output lengths, remaining steps and path, and the remaining critical-path time when given
  the models' service times.

A simulator without an annotator submits every call unannotated (the default; results unchanged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clairvoyant.bench.records import CallResult, RunRecords
from clairvoyant.bench.sim.lower_bound import ServiceTime, fresh_and_reused
from clairvoyant.bench.sim.replicas import TENANT, ReplicaSpec
from clairvoyant.bench.sim.simulator import Simulator
from clairvoyant.core.annotations import Confidence, LengthInterval, NextAgent, ProjectedCalls, SysAnnotations
from clairvoyant.policy.cache import CompletedCall
from clairvoyant.profiler import core as profiler
from clairvoyant.profiler.core import expr
from clairvoyant.profiler.core.sys_annotations import sys_annotations
from clairvoyant.workloads.program import Call, WorkflowProgram


class ProfilerAnnotator:
    """The profiler core, trained online on what the simulator completes.

    Each finished call becomes a profiler ``CallRecord``: start = the time it became ready (the
    gateway's arrival time), end = its end, its generated tokens, its parents and the agent of its
    first parent (Kairos' upstream id), ``workflow_end`` on its workflow's last call, and the block
    hash chains of its prompt and response from its completion record (the profiler learns the
    prompt-composition templates from them).  Every run starts at virtual time 0, so ``new_run``
    shifts the next run's times past everything seen.
    """

    needs_completions = True  # the chains

    def __init__(self, store: profiler.ProfileStore | None = None) -> None:
        self.store = store or profiler.ProfileStore()
        self.time_offset = 0.0
        self._latest = 0.0

    def annotate(self, program: WorkflowProgram, call: Call, now: float) -> SysAnnotations:
        annotation = self.store.annotate(
            TENANT,
            program.workflow_type,
            call.agent_id,
            workflow_id=program.workflow_id,
            prompt_tokens=call.prompt_tokens,
            now=now + self.time_offset,
        )
        return sys_annotations(annotation)

    def observe(
        self, program: WorkflowProgram, record: CallResult, last: bool, completion: CompletedCall | None = None
    ) -> None:
        """Ingest ``record``; without ``completion`` it has no chains (no template is learnt from it)."""
        assert record.end_time is not None
        call = program.call(record.call_id)
        start, end = record.ready_time + self.time_offset, record.end_time + self.time_offset
        upstream = program.call(call.dependencies[0]).agent_id if call.dependencies else None
        self.store.ingest(
            TENANT,
            program.workflow_type,
            profiler.CallRecord(
                request_id=record.call_id,
                workflow_id=program.workflow_id,
                agent_id=call.agent_id,
                start=start,
                end=end,
                prompt_tokens=call.prompt_tokens,
                output_tokens=record.generated_tokens,
                upstream_agent_id=upstream,
                parent_request_ids=call.dependencies,
                workflow_end=last,
                prompt_blocks=completion.prompt_block_hashes if completion is not None else (),
                response_blocks=completion.response_block_hashes if completion is not None else (),
            ),
        )
        self._latest = max(self._latest, end)

    def new_run(self) -> None:
        """The next simulator run starts after everything observed so far."""
        self.time_offset = self._latest

    def tier(self, workflow_type: str) -> profiler.Tier:
        profile = self.store.profiles.get((TENANT, workflow_type))
        return profile.confidence.tier if profile is not None else profiler.Tier.NONE

    def tiers(self) -> dict[str, str]:
        """Every workflow type seen so far, with its profile's confidence tier (``"shadow"``, ...)."""
        return {wt: p.confidence.tier.value for (tenant, wt), p in sorted(self.store.profiles.items()) if tenant == TENANT}


def warm_up(
    annotator: ProfilerAnnotator,
    replicas: Sequence[ReplicaSpec],
    arrivals: Sequence[tuple[float, WorkflowProgram]],
    *,
    backlog: Sequence[WorkflowProgram] = (),
    preset: str = "fcfs-rr",
    seed: int = 0,
) -> RunRecords:
    """Train ``annotator`` on a whole simulated run of a warm-up instance (its own replicas and
    workflow ids), under ``preset`` (FCFS by default: the warm-up is the same for every policy
    compared).  Afterwards the annotator's next run starts after the warm-up's last record."""
    records = Simulator(replicas, preset, seed=seed, annotator=annotator).run(arrivals, backlog=backlog)
    annotator.new_run()
    return records


PROJECTION_STEPS = 8  # how many steps ahead the oracle's projection looks (Pythia Alg. 4's horizon)


class _Truth:
    """One program's ground truth, per call id."""

    def __init__(self, program: WorkflowProgram, service_times: Mapping[str, ServiceTime]) -> None:
        children = program.dependents()
        # A call's step is its depth in the DAG: the longest chain of calls before it.
        self.depth: dict[str, int] = {}
        self.calls_at: dict[int, dict[str, int]] = {}  # depth -> agent -> calls of the workflow
        for call in program.calls:  # dependencies come earlier in the tuple
            depth = self.depth[call.call_id] = max((self.depth[d] + 1 for d in call.dependencies), default=0)
            at = self.calls_at.setdefault(depth, {})
            at[call.agent_id] = at.get(call.agent_id, 0) + 1
        self._paths: dict[int, str] = {}  # depth -> the path after it
        self.remaining_steps: dict[str, int] = {}
        self.remaining_time_s: dict[str, float] = {}
        self.next_agents: dict[str, tuple[str, ...]] = {}
        for call in reversed(program.calls):  # dependents come later in the tuple
            kids = [program.call(c) for c in children[call.call_id]]
            self.remaining_steps[call.call_id] = max(
                (1 + self.remaining_steps[k.call_id] for k in kids), default=0
            )
            self.next_agents[call.call_id] = tuple(dict.fromkeys(k.agent_id for k in kids))
            if service_times:
                after = max(
                    (_service(k, service_times) + self.remaining_time_s[k.call_id] for k in kids), default=0.0
                )
                self.remaining_time_s[call.call_id] = call.tool_latency_s + after

    def projection(self, call_id: str) -> tuple[ProjectedCalls, ...]:
        """The workflow's calls in each of the ``PROJECTION_STEPS`` steps after the call's own, per agent."""
        depth = self.depth[call_id]
        return tuple(
            ProjectedCalls(step, agent, float(count))
            for step in range(1, PROJECTION_STEPS + 1)
            for agent, count in sorted(self.calls_at.get(depth + step, {}).items())
        )

    def remaining_path(self, call_id: str) -> str:
        """The workflow's steps after the call's own, as a bounded path expression ending in ``$``
        (the profiler's grammar, ``profiler/core/expr.py``): a step of one call is its agent, of
        several calls ``<agent>{n}`` or ``<a | b>{n}`` (n calls in all, agents sorted).  The last
        step's calls get ``$``."""
        depth = self.depth[call_id]
        text = self._paths.get(depth)
        if text is None:
            steps = [_step(self.calls_at[after]) for after in range(depth + 1, len(self.calls_at))]
            text = self._paths[depth] = expr.to_text(expr.Seq((*steps, expr.End())) if steps else expr.End())
        return text


def _step(calls: Mapping[str, int]) -> expr.Expr:
    """One step of the path: its calls per agent."""
    total = sum(calls.values())
    agents = tuple(expr.Agent(agent_id) for agent_id in sorted(calls))
    if total == 1:
        return agents[0]
    return expr.FanOut(agents[0] if len(agents) == 1 else expr.Alt(agents), total, total)


def _service(call: Call, service_times: Mapping[str, ServiceTime]) -> float:
    fresh, reused = fresh_and_reused(call)
    return service_times[call.model].call_seconds(fresh, reused, call.output_tokens)


class OracleAnnotator:
    """The generator's ground truth, at confidence HIGH.

    - output length: p50 = p99 = the call's exact output tokens;
    - expected_remaining_steps: the longest chain of calls after this one (its height in the DAG;
      parallel calls are one step, as in the profiler's traces);
    - next_agents: the distinct agents of its direct dependents, each with probability 1;
    - predicted_path_regex: the workflow's steps after the call's own (``_Truth.remaining_path``:
      every call at a greater DAG depth, whether or not it descends from the call);
    - expected_remaining_time_s (only with ``service_times``): from its end, its tool plus the
      longest chain after it at batch-1 service times (no queueing: a lower bound);
    - projection (Pythia Alg. 4's ProjectGraph): the workflow's calls per agent at each DAG depth
      1..``PROJECTION_STEPS`` past the call's own (a step = a depth: the calls of a fan-out are one
      step), whether or not they descend from the call.
    Except in the path and the projection, branches that do not descend from the call are not
    counted (in the built-in workloads every branch joins again before the end).  No
    prompt_composition: the oracle does not turn the generator's prompt segments into templates
    (the profiler learns them from the calls' chains, ``ProfilerAnnotator``).
    """

    needs_completions = False

    def __init__(self, service_times: Mapping[str, ServiceTime] | None = None) -> None:
        self.service_times = dict(service_times or {})
        self._truth: dict[str, _Truth] = {}

    def annotate(self, program: WorkflowProgram, call: Call, now: float) -> SysAnnotations:
        truth = self._truth.get(program.workflow_id)
        if truth is None:
            truth = self._truth[program.workflow_id] = _Truth(program, self.service_times)
        remaining_time_s = truth.remaining_time_s.get(call.call_id)
        return SysAnnotations(
            confidence=Confidence.HIGH,
            predicted_output_len=LengthInterval(float(call.output_tokens), float(call.output_tokens)),
            expected_remaining_steps=float(truth.remaining_steps[call.call_id]),
            predicted_path_regex=truth.remaining_path(call.call_id),
            next_agents=tuple(NextAgent(agent_id, 1.0) for agent_id in truth.next_agents[call.call_id]),
            expected_remaining_time_s=float(remaining_time_s) if remaining_time_s is not None else None,
            projection=truth.projection(call.call_id),
        )

    def observe(
        self, program: WorkflowProgram, record: CallResult, last: bool, completion: CompletedCall | None = None
    ) -> None:
        if last:
            self._truth.pop(program.workflow_id, None)


ANNOTATIONS = ("none", "profiler", "profiler-path", "oracle")  # the experiment's --annotations choices
