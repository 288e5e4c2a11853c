"""Protobuf <-> the core's plain values, for the autoscaler's gRPC adapters."""

from __future__ import annotations

from collections.abc import Mapping

from clairvoyant.autoscaler.core import ClusterView, WorkerSeen
from clairvoyant.contracts.v1 import autoscaler_pb2, scheduler_pb2
from clairvoyant.core.wire import annotations_from_proto
from clairvoyant.policy.scaling import ActiveCall, ModelTraffic, ScalingDecision


def cluster_view(
    snapshot: scheduler_pb2.SchedulerSnapshot, active: scheduler_pb2.ActiveSnapshot
) -> ClusterView:
    workers = tuple(
        WorkerSeen(
            worker_id=w.worker_id,
            model=w.model,
            placed=w.placed,
            running=w.running,
            waiting=w.queued,
            kv_utilization=w.kv_blocks_used / w.kv_blocks_total if w.kv_blocks_total else 0.0,
            draining=w.draining,
            max_batch=w.max_batch,
            address=w.address,
        )
        for w in snapshot.workers
    )
    calls = tuple(_active_call(c) for c in active.calls)
    return ClusterView(
        workers=workers,
        queued={q.model: q.depth for q in snapshot.queues},
        active=calls,
        agent_models={(a.workflow_type_id, a.agent_id): a.model for a in active.agent_models},
        traffic={
            t.model: ModelTraffic(
                t.requests_total, t.input_tokens_total, t.completed_total, t.output_tokens_total
            )
            for t in active.traffic
        },
    )


def _active_call(call: scheduler_pb2.ActiveCall) -> ActiveCall:
    meta = call.app_metadata if call.HasField("app_metadata") else None
    return ActiveCall(
        request_id=call.request_id,
        model=call.model,
        queued=call.queued,
        workflow_type_id=meta.workflow_type_id if meta is not None else None,
        workflow_id=meta.workflow_id if meta is not None else None,
        agent_id=meta.agent_id if meta is not None else None,
        tenant=call.tenant,
        wait_s=call.wait_s,
        annotations=annotations_from_proto(call.annotations) if call.HasField("annotations") else None,
        workflow_end=meta is not None and meta.workflow_end,
    )


def scaling_plan(
    decision: ScalingDecision, drains_by_model: Mapping[str, list[str]]
) -> autoscaler_pb2.ScalingPlan:
    return autoscaler_pb2.ScalingPlan(
        decisions=[
            autoscaler_pb2.ScalingDecision(
                model=model,
                target_replicas=max(target, 0),
                drain_workers=drains_by_model.get(model, []),
                reason=decision.reasons.get(model, ""),
            )
            for model, target in sorted(decision.targets.items())
        ],
        diagnostics={k: float(v) for k, v in decision.diagnostics.items()},
    )
