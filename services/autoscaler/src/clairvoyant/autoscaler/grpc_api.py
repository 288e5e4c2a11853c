"""The Autoscaler gRPC service: ``Status`` (what the loop last saw and decided) and ``Plan`` (the
decision the policy would take now, without acting on it)."""

from __future__ import annotations

import copy
import time

import grpc

from clairvoyant.autoscaler import convert
from clairvoyant.autoscaler.scaler import Scaler
from clairvoyant.contracts.v1 import autoscaler_pb2, autoscaler_pb2_grpc
from clairvoyant.core.errors import InvalidRequest, Unavailable
from clairvoyant.core.grpc_errors import abort
from clairvoyant.policy.pythia_scaling import PythiaScaling
from clairvoyant.policy.scaling import ReplicaPhase, plan_actions


class AutoscalerServicer(autoscaler_pb2_grpc.AutoscalerServicer):
    def __init__(self, scaler: Scaler, policy_name: str, actuator_name: str) -> None:
        self.scaler = scaler
        self.policy_name = policy_name
        self.actuator_name = actuator_name

    async def Status(
        self, request: autoscaler_pb2.AutoscalerStatusRequest, context: grpc.aio.ServicerContext
    ) -> autoscaler_pb2.AutoscalerStatus:
        last = self.scaler.last
        status = autoscaler_pb2.AutoscalerStatus(
            policy=self.policy_name,
            gpu_budget=self.scaler.options.gpu_budget,
            failed_starts_total=self.scaler.failed_starts_total,
            last_tick_age_s=-1.0 if last.at is None else max(0.0, time.time() - last.at),
            actuator=self.actuator_name,
        )
        if last.state is None or last.decision is None:
            return status
        state, decision = last.state, last.decision
        status.gpus_in_use = sum(r.gpus for r in state.replicas)
        for model in sorted(set(state.models) | {r.model for r in state.replicas}):
            mine = [r for r in state.replicas if r.model == model]
            profile = state.models.get(model)
            status.models.append(
                autoscaler_pb2.ModelReplicas(
                    model=model,
                    current=sum(1 for r in mine if r.phase is ReplicaPhase.READY),
                    target=max(decision.targets.get(model, 0), 0),
                    draining=[r.replica_id for r in mine if r.phase is ReplicaPhase.DRAINING],
                    starting=[r.replica_id for r in mine if r.phase is ReplicaPhase.STARTING],
                    gpus_per_replica=profile.gpus_per_replica if profile else 1,
                )
            )
        return status

    async def Plan(
        self, request: autoscaler_pb2.ScalingPlanRequest, context: grpc.aio.ServicerContext
    ) -> autoscaler_pb2.ScalingPlan:
        policy = copy.deepcopy(self.scaler.policy)  # the live policy's history stays untouched
        if request.HasField("horizon_steps"):
            if not isinstance(policy, PythiaScaling):
                await abort(context, InvalidRequest(
                    f"horizon_steps applies to the pythia policy; this autoscaler runs {self.policy_name}",
                    param="horizon_steps",
                ))  # fmt: skip
            policy.horizon_steps = request.horizon_steps
        try:
            view = await self.scaler.read()
        except grpc.aio.AioRpcError as exc:
            await abort(context, Unavailable(f"the scheduler cannot be read: {exc.code().name}"))
        state = self.scaler.state_of(view)
        decision = policy.tick(state, self.scaler.clock.now())
        actions = plan_actions(decision, state)
        models = {r.replica_id: r.model for r in state.replicas}
        drains: dict[str, list[str]] = {}
        for replica_id in actions.drain:
            drains.setdefault(models[replica_id], []).append(replica_id)
        return convert.scaling_plan(decision, drains)
