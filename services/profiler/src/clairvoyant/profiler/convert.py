"""Wire <-> core: CompletionRecord to CallRecord, core annotations and profiles to protobuf."""

from __future__ import annotations

from typing import NamedTuple

from clairvoyant.contracts.v1 import common_pb2, profiler_pb2
from clairvoyant.core.wire import annotations_to_proto
from clairvoyant.profiler.core import Annotation, CallRecord, Tier, WorkflowProfile
from clairvoyant.profiler.core.sys_annotations import CONFIDENCE as TIER_CONFIDENCE
from clairvoyant.profiler.core.sys_annotations import sys_annotations as core_sys_annotations

# The wire enum's numbers are core's Confidence's (one mapping from tiers: the core's).
CONFIDENCE: dict[Tier, common_pb2.Confidence] = {
    tier: common_pb2.Confidence.ValueType(confidence) for tier, confidence in TIER_CONFIDENCE.items()
}


class KeyedRecord(NamedTuple):
    """A completed call and the profile it belongs to."""

    tenant: str
    workflow_type_id: str
    record: CallRecord


def call_record(msg: common_pb2.CompletionRecord) -> KeyedRecord | None:
    """The call a CompletionRecord describes, or None when it names no workflow (nothing to learn).

    Times are the gateway's wall clock: the call starts when the request arrived and ends when its
    last byte was sent (a record without an end time is taken as instantaneous)."""
    meta = msg.app_metadata
    if not (msg.HasField("app_metadata") and msg.request_id and meta.workflow_type_id and meta.workflow_id
            and meta.agent_id):
        return None
    start = msg.timing.arrival_time
    end = msg.timing.end_time if msg.timing.end_time >= start else start
    record = CallRecord(
        request_id=msg.request_id,
        workflow_id=meta.workflow_id,
        agent_id=meta.agent_id,
        start=start,
        end=end,
        prompt_tokens=msg.prompt_tokens,
        output_tokens=msg.output_tokens,
        upstream_agent_id=meta.upstream_agent_id if meta.HasField("upstream_agent_id") else None,
        parent_request_ids=tuple(meta.parent_request_ids),
        tool=meta.tool if meta.HasField("tool") else None,
        workflow_version=meta.workflow_version if meta.HasField("workflow_version") else None,
        workflow_end=meta.workflow_end,
        prompt_blocks=tuple(msg.prompt_block_hashes),
        response_blocks=tuple(msg.response_block_hashes),
        model=msg.model or None,
    )
    return KeyedRecord(msg.tenant, meta.workflow_type_id, record)


def sys_annotations(annotation: Annotation) -> common_pb2.SysAnnotations:
    return annotations_to_proto(core_sys_annotations(annotation))


def workflow_profile(profile: WorkflowProfile, *, agents: bool = True) -> profiler_pb2.WorkflowProfile:
    out = profiler_pb2.WorkflowProfile(
        tenant=profile.tenant,
        workflow_type_id=profile.workflow_type_id,
        path_expression=profile.expression,
        confidence=CONFIDENCE[profile.confidence.tier],
        instances=profile.instances,
    )
    if not agents:
        return out
    rank = profile.ranking().rank
    for agent_id, summary in sorted(profile.agent_summaries().items()):
        agent = profiler_pb2.AgentProfile(agent_id=agent_id, samples=summary.calls)
        if summary.output_len is not None:
            agent.output_len.CopyFrom(
                common_pb2.LengthInterval(p50=summary.output_len.p50, p99=summary.output_len.p99)
            )
            agent.output_len_cv = summary.output_len.cv
        if summary.service_s is not None:
            agent.mean_service_time_s = summary.service_s.mean
        if summary.remaining_s is not None:
            agent.mean_remaining_time_s = summary.remaining_s.mean
        if agent_id in rank:
            agent.kairos_rank = float(rank[agent_id])
        out.agents.append(agent)
    return out
