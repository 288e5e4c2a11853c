from clairvoyant.contracts.v1 import common_pb2 as _common_pb2
from clairvoyant.contracts.v1 import cachemgr_pb2 as _cachemgr_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "model", "chat", "prompt", "token_ids", "sampling", "tenant", "app_metadata", "annotations", "base_priority", "scheduler_preset", "program_wait_s", "program_service_s", "tools", "tool_choice", "parallel_tool_calls", "seat_limit")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    BASE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_PRESET_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    SEAT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    chat: ChatMessages
    prompt: str
    token_ids: TokenIds
    sampling: _common_pb2.SamplingParams
    tenant: str
    app_metadata: _common_pb2.AppMetadata
    annotations: _common_pb2.SysAnnotations
    base_priority: float
    scheduler_preset: str
    program_wait_s: float
    program_service_s: float
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.Tool]
    tool_choice: _common_pb2.ToolChoice
    parallel_tool_calls: bool
    seat_limit: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., tenant: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ..., base_priority: _Optional[float] = ..., scheduler_preset: _Optional[str] = ..., program_wait_s: _Optional[float] = ..., program_service_s: _Optional[float] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_common_pb2.ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., seat_limit: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "prompt_tokens", "prompt_block_hashes", "response_block_hashes", "prompt_token_ids", "logprobs", "stop_sequence", "tool_calls", "index")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: _common_pb2.Usage
    prompt_tokens: int
    prompt_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    response_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    stop_sequence: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCallDelta]
    index: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., prompt_block_hashes: _Optional[_Iterable[int]] = ..., response_block_hashes: _Optional[_Iterable[int]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., stop_sequence: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCallDelta, _Mapping]]] = ..., index: _Optional[int] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "chat", "prompt", "token_ids", "tenant", "app_metadata")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chat: ChatMessages
    prompt: str
    token_ids: TokenIds
    tenant: str
    app_metadata: _common_pb2.AppMetadata
    def __init__(self, request_id: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., prompt: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., tenant: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("prompt_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ApplyDirectivesRequest(_message.Message):
    __slots__ = ("directives",)
    DIRECTIVES_FIELD_NUMBER: _ClassVar[int]
    directives: _containers.RepeatedCompositeFieldContainer[_cachemgr_pb2.CacheDirective]
    def __init__(self, directives: _Optional[_Iterable[_Union[_cachemgr_pb2.CacheDirective, _Mapping]]] = ...) -> None: ...

class ApplyDirectivesResponse(_message.Message):
    __slots__ = ("applied",)
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    def __init__(self, applied: _Optional[int] = ...) -> None: ...

class ExportKVRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "workflow_id", "token_ids", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    workflow_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    model: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., workflow_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("request_id", "layer", "token_ids", "data", "dtype", "shape", "model", "tenant", "workflow_id", "num_layers")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    layer: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    model: str
    tenant: str
    workflow_id: str
    num_layers: int
    def __init__(self, request_id: _Optional[str] = ..., layer: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., model: _Optional[str] = ..., tenant: _Optional[str] = ..., workflow_id: _Optional[str] = ..., num_layers: _Optional[int] = ...) -> None: ...

class ImportKVResponse(_message.Message):
    __slots__ = ("tokens", "imported_tokens")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    imported_tokens: int
    def __init__(self, tokens: _Optional[int] = ..., imported_tokens: _Optional[int] = ...) -> None: ...

class WorkerDrainRequest(_message.Message):
    __slots__ = ("drain",)
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    drain: bool
    def __init__(self, drain: _Optional[bool] = ...) -> None: ...

class WorkerDrainResponse(_message.Message):
    __slots__ = ("requeued",)
    REQUEUED_FIELD_NUMBER: _ClassVar[int]
    requeued: int
    def __init__(self, requeued: _Optional[int] = ...) -> None: ...

class WorkerStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TierUsage(_message.Message):
    __slots__ = ("tier", "blocks_used", "blocks_total", "hit_tokens")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tier: _cachemgr_pb2.CacheTier
    blocks_used: int
    blocks_total: int
    hit_tokens: int
    def __init__(self, tier: _Optional[_Union[_cachemgr_pb2.CacheTier, str]] = ..., blocks_used: _Optional[int] = ..., blocks_total: _Optional[int] = ..., hit_tokens: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("kind", "tier", "tenant", "block_hashes", "parent_hash", "lineage", "response")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[KvEvent.Kind]
        STORED: _ClassVar[KvEvent.Kind]
        REMOVED: _ClassVar[KvEvent.Kind]
        CLEARED: _ClassVar[KvEvent.Kind]
    KIND_UNSPECIFIED: KvEvent.Kind
    STORED: KvEvent.Kind
    REMOVED: KvEvent.Kind
    CLEARED: KvEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    LINEAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    kind: KvEvent.Kind
    tier: _cachemgr_pb2.CacheTier
    tenant: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_hash: int
    lineage: _cachemgr_pb2.LineageSelector
    response: bool
    def __init__(self, kind: _Optional[_Union[KvEvent.Kind, str]] = ..., tier: _Optional[_Union[_cachemgr_pb2.CacheTier, str]] = ..., tenant: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., parent_hash: _Optional[int] = ..., lineage: _Optional[_Union[_cachemgr_pb2.LineageSelector, _Mapping]] = ..., response: _Optional[bool] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("worker_id", "model", "block_size", "sequence", "timestamp", "events")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    block_size: int
    sequence: int
    timestamp: float
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., block_size: _Optional[int] = ..., sequence: _Optional[int] = ..., timestamp: _Optional[float] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("worker_id", "model", "grpc_address", "http_address", "running", "queued", "max_batch", "kv_blocks_used", "kv_blocks_total", "kv_blocks_cached", "block_size", "max_model_len", "preemptions_total", "heartbeat_interval_s", "timestamp", "draining", "tiers", "held", "engine", "unsupported_directives", "decode_base_s", "decode_per_seq_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_CACHED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    UNSUPPORTED_DIRECTIVES_FIELD_NUMBER: _ClassVar[int]
    DECODE_BASE_S_FIELD_NUMBER: _ClassVar[int]
    DECODE_PER_SEQ_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    grpc_address: str
    http_address: str
    running: int
    queued: int
    max_batch: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_cached: int
    block_size: int
    max_model_len: int
    preemptions_total: int
    heartbeat_interval_s: float
    timestamp: float
    draining: bool
    tiers: _containers.RepeatedCompositeFieldContainer[TierUsage]
    held: HeldRequests
    engine: str
    unsupported_directives: _containers.RepeatedScalarFieldContainer[str]
    decode_base_s: float
    decode_per_seq_s: float
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., grpc_address: _Optional[str] = ..., http_address: _Optional[str] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_cached: _Optional[int] = ..., block_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., preemptions_total: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., timestamp: _Optional[float] = ..., draining: _Optional[bool] = ..., tiers: _Optional[_Iterable[_Union[TierUsage, _Mapping]]] = ..., held: _Optional[_Union[HeldRequests, _Mapping]] = ..., engine: _Optional[str] = ..., unsupported_directives: _Optional[_Iterable[str]] = ..., decode_base_s: _Optional[float] = ..., decode_per_seq_s: _Optional[float] = ...) -> None: ...

class HeldRequests(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...
