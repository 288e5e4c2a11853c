from clairvoyant.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CacheTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_TIER_UNSPECIFIED: _ClassVar[CacheTier]
    CACHE_TIER_L1: _ClassVar[CacheTier]
    CACHE_TIER_L2: _ClassVar[CacheTier]
    CACHE_TIER_L3: _ClassVar[CacheTier]

class DirectiveKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTIVE_KIND_UNSPECIFIED: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_DROP: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_RETAIN: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_WRITE_BACK: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_PROMOTE: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_PRE_PREFILL: _ClassVar[DirectiveKind]
CACHE_TIER_UNSPECIFIED: CacheTier
CACHE_TIER_L1: CacheTier
CACHE_TIER_L2: CacheTier
CACHE_TIER_L3: CacheTier
DIRECTIVE_KIND_UNSPECIFIED: DirectiveKind
DIRECTIVE_KIND_DROP: DirectiveKind
DIRECTIVE_KIND_RETAIN: DirectiveKind
DIRECTIVE_KIND_WRITE_BACK: DirectiveKind
DIRECTIVE_KIND_PROMOTE: DirectiveKind
DIRECTIVE_KIND_PRE_PREFILL: DirectiveKind

class LineageSelector(_message.Message):
    __slots__ = ("tenant", "workflow_id", "agent_id", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_id: str
    agent_id: str
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., workflow_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CacheDirective(_message.Message):
    __slots__ = ("kind", "lineage", "block_hashes", "ttl_s", "target_tier", "token_ids", "worker_id")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    TARGET_TIER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    kind: DirectiveKind
    lineage: LineageSelector
    block_hashes: _containers.RepeatedScalarFieldContainer[str]
    ttl_s: float
    target_tier: CacheTier
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    worker_id: str
    def __init__(self, kind: _Optional[_Union[DirectiveKind, str]] = ..., lineage: _Optional[_Union[LineageSelector, _Mapping]] = ..., block_hashes: _Optional[_Iterable[str]] = ..., ttl_s: _Optional[float] = ..., target_tier: _Optional[_Union[CacheTier, str]] = ..., token_ids: _Optional[_Iterable[int]] = ..., worker_id: _Optional[str] = ...) -> None: ...

class HintRequest(_message.Message):
    __slots__ = ("tenant", "app_metadata", "annotations")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    app_metadata: _common_pb2.AppMetadata
    annotations: _common_pb2.SysAnnotations
    def __init__(self, tenant: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ...) -> None: ...

class HintResponse(_message.Message):
    __slots__ = ("directives_issued",)
    DIRECTIVES_ISSUED_FIELD_NUMBER: _ClassVar[int]
    directives_issued: int
    def __init__(self, directives_issued: _Optional[int] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class CachePlan(_message.Message):
    __slots__ = ("directives",)
    DIRECTIVES_FIELD_NUMBER: _ClassVar[int]
    directives: _containers.RepeatedCompositeFieldContainer[CacheDirective]
    def __init__(self, directives: _Optional[_Iterable[_Union[CacheDirective, _Mapping]]] = ...) -> None: ...

class CacheStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "blocks_used", "blocks_total", "hits", "misses")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    tier: CacheTier
    blocks_used: int
    blocks_total: int
    hits: int
    misses: int
    def __init__(self, tier: _Optional[_Union[CacheTier, str]] = ..., blocks_used: _Optional[int] = ..., blocks_total: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ...) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("tiers", "indexed_blocks", "policy", "directives_issued", "completions_seen", "events_seen", "malformed_dropped", "live_workflows", "history_bytes", "workers")
    TIERS_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DIRECTIVES_ISSUED_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_SEEN_FIELD_NUMBER: _ClassVar[int]
    EVENTS_SEEN_FIELD_NUMBER: _ClassVar[int]
    MALFORMED_DROPPED_FIELD_NUMBER: _ClassVar[int]
    LIVE_WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    indexed_blocks: int
    policy: str
    directives_issued: int
    completions_seen: int
    events_seen: int
    malformed_dropped: int
    live_workflows: int
    history_bytes: int
    workers: int
    def __init__(self, tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., indexed_blocks: _Optional[int] = ..., policy: _Optional[str] = ..., directives_issued: _Optional[int] = ..., completions_seen: _Optional[int] = ..., events_seen: _Optional[int] = ..., malformed_dropped: _Optional[int] = ..., live_workflows: _Optional[int] = ..., history_bytes: _Optional[int] = ..., workers: _Optional[int] = ...) -> None: ...
