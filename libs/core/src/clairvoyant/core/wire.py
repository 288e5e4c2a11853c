"""Protobuf conversions of core's plain value types, for the gRPC and NATS adapters."""

from __future__ import annotations

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.app_metadata import OPTIONAL_IDS, AppMetadata


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
