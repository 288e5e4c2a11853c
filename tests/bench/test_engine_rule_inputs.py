"""One recorded trace gives the same engine decisions through the live worker's rule binding and
through the simulator's: the engine rule reads the same inputs in both.

The trace: the Autellix Fig. 2 programs under the ``autellix`` preset in unit time, where programs
accrue waiting and service and later calls are placed with that debt.  The simulator's path is its
own (``Decision`` -> ``EngineRequest``); the live path is the adapters' (``Decision`` -> the
scheduler's ``Placement`` -> the gateway's ``GenerateRequest`` -> the worker's ``EngineRequest``).
Each call's sequence is then ranked over the same steps by a rule of each binding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from clairvoyant.bench.sim.lower_bound import UnitServiceTime
from clairvoyant.bench.sim.simulator import ReplicaSpec, Simulator
from clairvoyant.bench.sim.unit_time import UnitTimeRunner
from clairvoyant.contracts.v1 import worker_pb2
from clairvoyant.gateway.pipeline import placed_generate_request
from clairvoyant.policy.types import Decision
from clairvoyant.scheduler import convert
from clairvoyant.worker.core.engine import EngineConfig
from clairvoyant.worker.core.sampling import SamplingParams
from clairvoyant.worker.core.types import EngineRequest
from clairvoyant.worker.rules import preset_rule
from tests.bench.test_sim_unit_time import chain

pytestmark = pytest.mark.unit


def record_trace() -> tuple[list[Decision], list[EngineRequest], Simulator]:
    config = EngineConfig(block_size=4, num_blocks=256, max_num_seqs=2, enable_prefix_cache=False)
    sim = Simulator(
        [ReplicaSpec("w0", UnitTimeRunner(), config)], "autellix", service_times={"unit": UnitServiceTime()}
    )
    decisions: list[Decision] = []
    requests: list[EngineRequest] = []
    dispatch = sim.scheduler.dispatch

    def recording_dispatch(now: float) -> list[Decision]:
        placed = dispatch(now)
        decisions.extend(placed)
        return placed

    sim.scheduler.dispatch = recording_dispatch  # type: ignore[method-assign]
    engine = sim.replicas["w0"].engine
    add_request = engine.add_request

    def recording_add(request: EngineRequest, *args: Any, **kwargs: Any) -> Any:
        requests.append(request)
        return add_request(request, *args, **kwargs)

    engine.add_request = recording_add  # type: ignore[method-assign]
    programs = [chain("A", [4, 3, 1, 1]), chain("B", [3, 3, 4]), chain("C", [1, 2]), chain("D", [4])]
    sim.run([(0.0, p) for p in programs])
    return decisions, requests, sim


def live_engine_request(decision: Decision) -> EngineRequest:
    """What a live worker builds for ``decision``, through the adapters' own conversions."""
    placement = convert.placement(decision, "autellix", lease_s=30.0)
    generate = placed_generate_request(worker_pb2.GenerateRequest(request_id=decision.request_id), placement)
    return EngineRequest(  # the worker's gRPC edge passes these fields to WorkerFrontend.build_request
        request_id=generate.request_id,
        prompt_token_ids=[1, 2, 3, 4],
        sampling=SamplingParams(max_tokens=4),
        priority=generate.base_priority,
        scheduler_preset=generate.scheduler_preset,
        program_wait_s=generate.program_wait_s,
        program_service_s=generate.program_service_s,
    )


class _Seq:
    """What the engine's Sequence takes from its request and the rule reads."""

    def __init__(self, request: EngineRequest) -> None:
        self.priority = request.priority
        self.program_wait_s = request.program_wait_s
        self.program_service_s = request.program_service_s
        self.lineage = request.lineage
        self.num_output_tokens = 0


def ranks(rule: Any, request: EngineRequest) -> list[float]:
    """The rule's effective priority of one sequence over a fixed pattern of run/wait steps."""
    seq = _Seq(request)
    out = []
    pattern = (True, True) + (False,) * 30  # served 2 steps, then starved: beta decides when it is promoted
    for step, runs in enumerate(pattern):
        out.append(rule.effective_priority(seq, float(step)))
        seq.num_output_tokens += runs
    return out


def test_the_engine_rule_decides_the_same_live_and_simulated() -> None:
    decisions, simulated, sim = record_trace()
    assert len(decisions) == len(simulated) == 10
    assert any(d.program_wait_s > 0 or d.program_service_s > 0 for d in decisions), "a trace with no debt"
    by_id = {request.request_id: request for request in simulated}
    for decision in decisions:
        sim_request, live_request = by_id[decision.request_id], live_engine_request(decision)
        read = ("priority", "program_wait_s", "program_service_s")
        assert [getattr(sim_request, f) for f in read] == [getattr(live_request, f) for f in read]
        live_rule, sim_rule = preset_rule("autellix"), sim.scheduler.engine_rule()
        assert type(live_rule) is type(sim_rule)
        assert ranks(live_rule, live_request) == ranks(sim_rule, sim_request)
    # And the program's debt changes decisions on this trace: without it, some call ranks otherwise.
    without_debt = [replace(request, program_wait_s=0.0, program_service_s=0.0) for request in simulated]
    assert any(
        ranks(preset_rule("autellix"), plain) != ranks(preset_rule("autellix"), request)
        for plain, request in zip(without_debt, simulated, strict=True)
    )
