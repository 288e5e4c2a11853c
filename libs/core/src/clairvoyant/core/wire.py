"""Protobuf conversions of core's plain value types (AppMetadata, SysAnnotations, KvBatch, and the
tools and constraints of ``core.structured``), for the gRPC and NATS adapters."""

from __future__ import annotations

import json

from clairvoyant.contracts.v1 import cachemgr_pb2, common_pb2, worker_pb2
from clairvoyant.core.annotations import Confidence, LengthInterval, NextAgent, ProjectedCalls, SysAnnotations
from clairvoyant.core.app_metadata import OPTIONAL_IDS, AppMetadata
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.kv_events import KvBatch, KvBlockEvent, KvEventKind, KvTier
from clairvoyant.core.structured import OutputConstraint, ToolCall, ToolChoice, ToolChoiceMode, ToolSpec


def app_metadata_to_proto(meta: AppMetadata) -> common_pb2.AppMetadata:
    msg = common_pb2.AppMetadata(
        workflow_type_id=meta.workflow_type_id,
        workflow_id=meta.workflow_id,
        agent_id=meta.agent_id,
        parent_request_ids=list(meta.parent_request_ids),
    )
    for name in OPTIONAL_IDS:
        value = getattr(meta, name)
        if value is not None:
            setattr(msg, name, value)
    if meta.workflow_end is not None:
        msg.workflow_end = meta.workflow_end
    return msg


def app_metadata_from_proto(msg: common_pb2.AppMetadata) -> AppMetadata:
    return AppMetadata(
        workflow_type_id=msg.workflow_type_id,
        workflow_id=msg.workflow_id,
        agent_id=msg.agent_id,
        upstream_agent_id=msg.upstream_agent_id if msg.HasField("upstream_agent_id") else None,
        parent_request_ids=tuple(msg.parent_request_ids),
        tool=msg.tool if msg.HasField("tool") else None,
        workflow_version=msg.workflow_version if msg.HasField("workflow_version") else None,
        workflow_end=msg.workflow_end if msg.HasField("workflow_end") else None,
    )


def annotations_to_proto(annotations: SysAnnotations) -> common_pb2.SysAnnotations:
    msg = common_pb2.SysAnnotations(
        confidence=common_pb2.Confidence.ValueType(annotations.confidence),
        predicted_path_regex=annotations.predicted_path_regex,
        next_agents=[
            common_pb2.NextAgent(agent_id=a.agent_id, probability=a.probability)
            for a in annotations.next_agents
        ],
        prompt_composition=annotations.prompt_composition,
        projection=[
            common_pb2.ProjectedCalls(step=p.step, agent_id=p.agent_id, expected_calls=p.expected_calls)
            for p in annotations.projection
        ],
    )
    length = annotations.predicted_output_len
    if length is not None:
        msg.predicted_output_len.CopyFrom(common_pb2.LengthInterval(p50=length.p50, p99=length.p99))
    for name in _OPTIONAL_NUMBERS:
        value = getattr(annotations, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def annotations_from_proto(msg: common_pb2.SysAnnotations) -> SysAnnotations:
    length = msg.predicted_output_len if msg.HasField("predicted_output_len") else None
    numbers = {name: getattr(msg, name) if msg.HasField(name) else None for name in _OPTIONAL_NUMBERS}
    return SysAnnotations(
        confidence=Confidence(msg.confidence) if msg.confidence in _CONFIDENCES else Confidence.UNSPECIFIED,
        predicted_output_len=LengthInterval(length.p50, length.p99) if length is not None else None,
        predicted_path_regex=msg.predicted_path_regex,
        next_agents=tuple(NextAgent(a.agent_id, a.probability) for a in msg.next_agents),
        prompt_composition=msg.prompt_composition,
        projection=tuple(ProjectedCalls(p.step, p.agent_id, p.expected_calls) for p in msg.projection),
        **numbers,
    )


_OPTIONAL_NUMBERS = (
    "expected_remaining_steps",
    "expected_remaining_time_s",
    "kairos_rank",
    "attained_service_s",
    "remaining_gittins_index",
)
_CONFIDENCES = frozenset(int(c) for c in Confidence)


_KV_KINDS = {
    worker_pb2.KvEvent.STORED: KvEventKind.STORED,
    worker_pb2.KvEvent.REMOVED: KvEventKind.REMOVED,
    worker_pb2.KvEvent.CLEARED: KvEventKind.CLEARED,
}
_KV_TIERS = {
    cachemgr_pb2.CACHE_TIER_L1: KvTier.L1,
    cachemgr_pb2.CACHE_TIER_L2: KvTier.L2,
    cachemgr_pb2.CACHE_TIER_L3: KvTier.L3,
}


def kv_batch(msg: worker_pb2.KvEventBatch) -> KvBatch:
    """Raises InvalidRequest for a batch an index cannot use: no worker or model, or an event of
    an unknown kind or tier (the whole batch goes: applying part of it would leave a hole)."""
    if not msg.worker_id or not msg.model:
        raise InvalidRequest("a KV event batch needs worker_id and model")
    events = []
    for event in msg.events:
        kind, tier = _KV_KINDS.get(event.kind), _KV_TIERS.get(event.tier)
        if kind is None or tier is None:
            raise InvalidRequest(f"KV event of unknown kind {event.kind} or tier {event.tier}")
        lineage = event.lineage
        events.append(
            KvBlockEvent(
                kind=kind,
                tier=tier,
                tenant=event.tenant,
                block_hashes=tuple(event.block_hashes),
                workflow_id=lineage.workflow_id,
                agent_id=lineage.agent_id,
                request_id=lineage.request_id,
                response=event.response,
                parent_hash=event.parent_hash if event.HasField("parent_hash") else None,
            )
        )
    return KvBatch(
        worker_id=msg.worker_id,
        model=msg.model,
        block_size=msg.block_size,
        sequence=msg.sequence,
        events=tuple(events),
    )


# ---- tools and output constraints (core.structured) --------------------------------------------
_TOOL_CHOICE_MODES: dict[ToolChoiceMode, common_pb2.ToolChoice.Mode] = {
    "auto": common_pb2.ToolChoice.AUTO,
    "none": common_pb2.ToolChoice.NONE,
    "required": common_pb2.ToolChoice.REQUIRED,
    "function": common_pb2.ToolChoice.FUNCTION,
}
_TOOL_CHOICE_NAMES = {value: name for name, value in _TOOL_CHOICE_MODES.items()}


def constraint_to_proto(constraint: OutputConstraint) -> common_pb2.OutputConstraint:
    msg = common_pb2.OutputConstraint()
    if constraint.kind == "json_object":
        msg.json_object = True
    elif constraint.kind == "choice":
        msg.choice.choices.extend(json.loads(constraint.spec))
    else:
        setattr(msg, constraint.kind, constraint.spec)
    return msg


def constraint_from_proto(msg: common_pb2.OutputConstraint) -> OutputConstraint | None:
    """None when no kind is set (or ``json_object`` is false)."""
    kind = msg.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not msg.json_object):
        return None
    if kind == "json_object":
        return OutputConstraint("json_object")
    if kind == "choice":
        return OutputConstraint("choice", json.dumps(list(msg.choice.choices)))
    return OutputConstraint(kind, getattr(msg, kind))


def tool_to_proto(tool: ToolSpec) -> common_pb2.Tool:
    params = "" if tool.parameters is None else json.dumps(tool.parameters, separators=(",", ":"))
    return common_pb2.Tool(name=tool.name, description=tool.description, parameters_json=params, strict=tool.strict)


def tool_from_proto(msg: common_pb2.Tool) -> ToolSpec:
    """Raises InvalidRequest when ``parameters_json`` is not a JSON object."""
    params = None
    if msg.parameters_json:
        try:
            params = json.loads(msg.parameters_json)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"tool {msg.name!r}: parameters_json is not JSON ({exc})", param="tools") from None
        if not isinstance(params, dict):
            raise InvalidRequest(f"tool {msg.name!r}: parameters_json must be a JSON object", param="tools")
    return ToolSpec(msg.name, msg.description, params, msg.strict)


def tool_choice_to_proto(choice: ToolChoice) -> common_pb2.ToolChoice:
    return common_pb2.ToolChoice(mode=_TOOL_CHOICE_MODES[choice.mode], function_name=choice.name)


def tool_choice_from_proto(msg: common_pb2.ToolChoice) -> ToolChoice:
    return ToolChoice(_TOOL_CHOICE_NAMES[msg.mode], msg.function_name)


def tool_call_to_proto(call: ToolCall) -> common_pb2.ToolCall:
    return common_pb2.ToolCall(id=call.id, name=call.name, arguments=call.arguments)


def tool_call_from_proto(msg: common_pb2.ToolCall) -> ToolCall:
    return ToolCall(msg.id, msg.name, msg.arguments)
