"""Wire <-> core: protobuf messages to the core's value objects and back."""

from __future__ import annotations

from collections.abc import Mapping

from clairvoyant.contracts.v1 import scheduler_pb2, worker_pb2
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.model_groups import INPUT_TEXT_MAX_CHARS, ModelGroups
from clairvoyant.core.wire import (
    annotations_from_proto,
    annotations_to_proto,
    app_metadata_from_proto,
    app_metadata_to_proto,
)
from clairvoyant.policy.scaling import ModelTraffic
from clairvoyant.scheduler.core import (
    Decision,
    HeldCall,
    QueuedRequest,
    SchedulerSnapshot,
    WorkerReport,
)


def queued_request(msg: scheduler_pb2.ScheduleRequest, now: float) -> QueuedRequest:
    """Raises InvalidRequest when the ids the scheduler keys on are missing."""
    if not msg.request_id:
        raise InvalidRequest("request_id is required", param="request_id")
    if not msg.model:
        raise InvalidRequest("model is required", param="model")
    annotations = annotations_from_proto(msg.annotations) if msg.HasField("annotations") else None
    return QueuedRequest(
        request_id=msg.request_id,
        tenant=msg.tenant,
        model=msg.model,
        arrival_time=now,
        prompt_tokens=msg.prompt_tokens,
        max_tokens=msg.max_tokens,
        app_metadata=app_metadata_from_proto(msg.app_metadata) if msg.HasField("app_metadata") else None,
        annotations=annotations,
        exclude_workers=frozenset(msg.exclude_workers),
        owner=msg.owner,
        prompt_block_hashes=tuple(msg.prompt_block_hashes),
        input_text=msg.input_text[:INPUT_TEXT_MAX_CHARS],
    )


def worker_report(stats: worker_pb2.WorkerStats) -> WorkerReport:
    return WorkerReport(
        worker_id=stats.worker_id,
        model=stats.model,
        address=stats.grpc_address,
        http_address=stats.http_address,
        running=stats.running,
        queued=stats.queued,
        max_batch=stats.max_batch,
        kv_blocks_used=stats.kv_blocks_used,
        kv_blocks_total=stats.kv_blocks_total,
        max_model_len=stats.max_model_len,
        draining=stats.draining,
        heartbeat_interval_s=stats.heartbeat_interval_s,
        preemptions_total=stats.preemptions_total,
        block_size=stats.block_size,
        held_requests=frozenset(stats.held.request_ids) if stats.HasField("held") else None,
        decode_base_s=stats.decode_base_s,
        decode_per_seq_s=stats.decode_per_seq_s,
    )


def placement(decision: Decision, preset: str = "", lease_s: float = 0.0) -> scheduler_pb2.Placement:
    """``preset``: the scheduler's preset name, which the worker's engine rule follows; ``lease_s``:
    how long the placement lives without a Renew (0: it has no lease).  The placement's model is
    its worker's: for a call of a model group, the one the policy chose."""
    return scheduler_pb2.Placement(
        request_id=decision.request_id,
        worker_id=decision.worker_id,
        worker_address=decision.worker.address,
        model=decision.worker.model,
        base_priority=decision.base_priority,
        queue_wait_s=decision.queue_wait_s,
        preset=preset,
        lease_s=lease_s,
        program_wait_s=decision.program_wait_s,
        program_service_s=decision.program_service_s,
        seat_limit=decision.seat_limit,
    )


def snapshot(snap: SchedulerSnapshot, groups: ModelGroups | None = None) -> scheduler_pb2.SchedulerSnapshot:
    """``groups``: the declared model groups, listed with their models cheapest first."""
    return scheduler_pb2.SchedulerSnapshot(
        policy=snap.policy,
        groups=[
            scheduler_pb2.ModelGroupInfo(name=group.name, models=group.models)
            for group in (groups.groups.values() if groups is not None else ())
        ],
        queues=[
            scheduler_pb2.ModelQueue(model=q.model, depth=q.depth, capacity=q.capacity) for q in snap.queues
        ],
        workers=[
            scheduler_pb2.WorkerState(
                worker_id=w.worker_id,
                model=w.model,
                address=w.address,
                http_address=w.http_address,
                running=w.running,
                queued=w.queued,
                placed=w.placed,
                max_batch=w.max_batch,
                kv_blocks_used=w.kv_blocks_used,
                kv_blocks_total=w.kv_blocks_total,
                max_model_len=w.max_model_len,
                draining=w.draining,
                last_heartbeat_age_s=max(0.0, snap.taken_at - w.last_heartbeat),
            )
            for w in snap.workers
        ],
    )


def active_call(held: HeldCall) -> scheduler_pb2.ActiveCall:
    request = held.request
    msg = scheduler_pb2.ActiveCall(
        request_id=request.request_id,
        tenant=request.tenant,
        model=request.model,
        queued=held.worker_id is None,
        worker_id=held.worker_id or "",
        wait_s=held.wait_s,
        prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens,
    )
    if request.app_metadata is not None:
        msg.app_metadata.CopyFrom(app_metadata_to_proto(request.app_metadata))
    if request.annotations is not None:
        msg.annotations.CopyFrom(annotations_to_proto(request.annotations))
    return msg


def active_snapshot(
    held: list[HeldCall],
    agent_models: Mapping[tuple[str, str], str],
    traffic: Mapping[str, ModelTraffic],
    now: float,
) -> scheduler_pb2.ActiveSnapshot:
    return scheduler_pb2.ActiveSnapshot(
        calls=[active_call(call) for call in held],
        agent_models=[
            scheduler_pb2.AgentModel(workflow_type_id=workflow_type, agent_id=agent, model=model)
            for (workflow_type, agent), model in sorted(agent_models.items())
        ],
        traffic=[
            scheduler_pb2.ModelTraffic(
                model=model,
                requests_total=counts.requests_total,
                input_tokens_total=counts.input_tokens_total,
                completed_total=counts.completed_total,
                output_tokens_total=counts.output_tokens_total,
            )
            for model, counts in sorted(traffic.items())
        ],
        now=now,
    )
