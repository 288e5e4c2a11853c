from clairvoyant.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScheduleRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "model", "app_metadata", "annotations", "prompt_tokens", "max_tokens", "exclude_workers", "owner", "prompt_block_hashes", "input_text")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    INPUT_TEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    model: str
    app_metadata: _common_pb2.AppMetadata
    annotations: _common_pb2.SysAnnotations
    prompt_tokens: int
    max_tokens: int
    exclude_workers: _containers.RepeatedScalarFieldContainer[str]
    owner: str
    prompt_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    input_text: str
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., exclude_workers: _Optional[_Iterable[str]] = ..., owner: _Optional[str] = ..., prompt_block_hashes: _Optional[_Iterable[int]] = ..., input_text: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("request_id", "worker_id", "worker_address", "base_priority", "queue_wait_s", "cache_hints", "preset", "lease_s", "program_wait_s", "program_service_s", "model", "seat_limit")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BASE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_HINTS_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SEAT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    worker_address: str
    base_priority: float
    queue_wait_s: float
    cache_hints: _containers.RepeatedScalarFieldContainer[str]
    preset: str
    lease_s: float
    program_wait_s: float
    program_service_s: float
    model: str
    seat_limit: int
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., worker_address: _Optional[str] = ..., base_priority: _Optional[float] = ..., queue_wait_s: _Optional[float] = ..., cache_hints: _Optional[_Iterable[str]] = ..., preset: _Optional[str] = ..., lease_s: _Optional[float] = ..., program_wait_s: _Optional[float] = ..., program_service_s: _Optional[float] = ..., model: _Optional[str] = ..., seat_limit: _Optional[int] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("request_id", "worker_id", "status", "output_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    status: _common_pb2.RequestStatus
    output_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., status: _Optional[_Union[_common_pb2.RequestStatus, str]] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("owner", "request_ids")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, owner: _Optional[str] = ..., request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("unknown_request_ids",)
    UNKNOWN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "model", "address", "running", "queued", "placed", "max_batch", "kv_blocks_used", "kv_blocks_total", "draining", "last_heartbeat_age_s", "max_model_len", "http_address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    address: str
    running: int
    queued: int
    placed: int
    max_batch: int
    kv_blocks_used: int
    kv_blocks_total: int
    draining: bool
    last_heartbeat_age_s: float
    max_model_len: int
    http_address: str
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., address: _Optional[str] = ..., running: _Optional[int] = ..., queued: _Optional[int] = ..., placed: _Optional[int] = ..., max_batch: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., draining: _Optional[bool] = ..., last_heartbeat_age_s: _Optional[float] = ..., max_model_len: _Optional[int] = ..., http_address: _Optional[str] = ...) -> None: ...

class ModelQueue(_message.Message):
    __slots__ = ("model", "depth", "capacity")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    depth: int
    capacity: int
    def __init__(self, model: _Optional[str] = ..., depth: _Optional[int] = ..., capacity: _Optional[int] = ...) -> None: ...

class ModelGroupInfo(_message.Message):
    __slots__ = ("name", "models")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class SchedulerSnapshot(_message.Message):
    __slots__ = ("policy", "queues", "workers", "expected_models", "groups")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MODELS_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    queues: _containers.RepeatedCompositeFieldContainer[ModelQueue]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    expected_models: _containers.RepeatedScalarFieldContainer[str]
    groups: _containers.RepeatedCompositeFieldContainer[ModelGroupInfo]
    def __init__(self, policy: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[ModelQueue, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ..., expected_models: _Optional[_Iterable[str]] = ..., groups: _Optional[_Iterable[_Union[ModelGroupInfo, _Mapping]]] = ...) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_id", "drain")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    drain: bool
    def __init__(self, worker_id: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ActiveRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ActiveCall(_message.Message):
    __slots__ = ("request_id", "tenant", "model", "app_metadata", "annotations", "queued", "worker_id", "wait_s", "prompt_tokens", "max_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    model: str
    app_metadata: _common_pb2.AppMetadata
    annotations: _common_pb2.SysAnnotations
    queued: bool
    worker_id: str
    wait_s: float
    prompt_tokens: int
    max_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., model: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ..., queued: _Optional[bool] = ..., worker_id: _Optional[str] = ..., wait_s: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class AgentModel(_message.Message):
    __slots__ = ("workflow_type_id", "agent_id", "model")
    WORKFLOW_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    workflow_type_id: str
    agent_id: str
    model: str
    def __init__(self, workflow_type_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class ModelTraffic(_message.Message):
    __slots__ = ("model", "requests_total", "input_tokens_total", "completed_total", "output_tokens_total")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    model: str
    requests_total: int
    input_tokens_total: int
    completed_total: int
    output_tokens_total: int
    def __init__(self, model: _Optional[str] = ..., requests_total: _Optional[int] = ..., input_tokens_total: _Optional[int] = ..., completed_total: _Optional[int] = ..., output_tokens_total: _Optional[int] = ...) -> None: ...

class ActiveSnapshot(_message.Message):
    __slots__ = ("calls", "agent_models", "traffic", "now")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    AGENT_MODELS_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ActiveCall]
    agent_models: _containers.RepeatedCompositeFieldContainer[AgentModel]
    traffic: _containers.RepeatedCompositeFieldContainer[ModelTraffic]
    now: float
    def __init__(self, calls: _Optional[_Iterable[_Union[ActiveCall, _Mapping]]] = ..., agent_models: _Optional[_Iterable[_Union[AgentModel, _Mapping]]] = ..., traffic: _Optional[_Iterable[_Union[ModelTraffic, _Mapping]]] = ..., now: _Optional[float] = ...) -> None: ...

class ExpectModelsRequest(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, models: _Optional[_Iterable[str]] = ...) -> None: ...

class ExpectModelsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
