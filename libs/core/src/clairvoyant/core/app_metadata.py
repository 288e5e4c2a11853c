"""AppMetadata: the three ids (and optional extras) applications tag each request with.

A plain value; ``clairvoyant.core.wire`` converts it to and from its protobuf message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from clairvoyant.core.errors import InvalidRequest

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
ID_RULE = "1 to 128 characters from A-Z a-z 0-9 . _ : @ / + = -"
REQUIRED = ("workflow_type_id", "workflow_id", "agent_id")
OPTIONAL_IDS = ("upstream_agent_id", "tool", "workflow_version")
MAX_PARENTS = 64


@dataclass(frozen=True)
class AppMetadata:
    workflow_type_id: str
    workflow_id: str
    agent_id: str
    upstream_agent_id: str | None = None
    parent_request_ids: tuple[str, ...] = field(default_factory=tuple)
    tool: str | None = None
    workflow_version: str | None = None
    workflow_end: bool | None = None


def _check_id(value: object, param: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidRequest(f"{param} must be a string of {ID_RULE}", param=param, code="invalid_app_metadata")
    return value


def parse_app_metadata(raw: object, param: str = "app_metadata") -> AppMetadata:
    """Validate an ``app_metadata`` object from a request body.  Raises InvalidRequest."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{param} must be an object", param=param, code="invalid_app_metadata")
    known = {*REQUIRED, *OPTIONAL_IDS, "parent_request_ids", "workflow_end"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidRequest(
            f"{param} has unknown field(s) {unknown}; allowed: {sorted(known)}", param=param, code="invalid_app_metadata"
        )
    for name in REQUIRED:
        if name not in raw:
            raise InvalidRequest(f"{param}.{name} is required", param=f"{param}.{name}", code="invalid_app_metadata")
    ids = {name: _check_id(raw[name], f"{param}.{name}") for name in REQUIRED}
    extras = {name: _check_id(raw[name], f"{param}.{name}") for name in OPTIONAL_IDS if raw.get(name) is not None}
    parents = raw.get("parent_request_ids") or []
    if not isinstance(parents, list) or len(parents) > MAX_PARENTS:
        raise InvalidRequest(
            f"{param}.parent_request_ids must be a list of at most {MAX_PARENTS} ids",
            param=f"{param}.parent_request_ids",
            code="invalid_app_metadata",
        )
    parent_ids = tuple(_check_id(p, f"{param}.parent_request_ids") for p in parents)
    end = raw.get("workflow_end")
    if end is not None and not isinstance(end, bool):
        raise InvalidRequest(f"{param}.workflow_end must be a boolean", param=f"{param}.workflow_end")
    return AppMetadata(**ids, **extras, parent_request_ids=parent_ids, workflow_end=end)
