from clairvoyant.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AnnotateRequest(_message.Message):
    __slots__ = ("request_id", "tenant", "app_metadata", "model", "prompt_tokens", "arrival_time")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    app_metadata: _common_pb2.AppMetadata
    model: str
    prompt_tokens: int
    arrival_time: float
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., model: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., arrival_time: _Optional[float] = ...) -> None: ...

class AnnotateResponse(_message.Message):
    __slots__ = ("annotations",)
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    annotations: _common_pb2.SysAnnotations
    def __init__(self, annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("tenant", "workflow_type_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_type_id: str
    def __init__(self, tenant: _Optional[str] = ..., workflow_type_id: _Optional[str] = ...) -> None: ...

class AgentProfile(_message.Message):
    __slots__ = ("agent_id", "output_len", "output_len_cv", "mean_service_time_s", "mean_remaining_time_s", "kairos_rank", "samples")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_CV_FIELD_NUMBER: _ClassVar[int]
    MEAN_SERVICE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MEAN_REMAINING_TIME_S_FIELD_NUMBER: _ClassVar[int]
    KAIROS_RANK_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    output_len: _common_pb2.LengthInterval
    output_len_cv: float
    mean_service_time_s: float
    mean_remaining_time_s: float
    kairos_rank: float
    samples: int
    def __init__(self, agent_id: _Optional[str] = ..., output_len: _Optional[_Union[_common_pb2.LengthInterval, _Mapping]] = ..., output_len_cv: _Optional[float] = ..., mean_service_time_s: _Optional[float] = ..., mean_remaining_time_s: _Optional[float] = ..., kairos_rank: _Optional[float] = ..., samples: _Optional[int] = ...) -> None: ...

class WorkflowProfile(_message.Message):
    __slots__ = ("tenant", "workflow_type_id", "path_expression", "confidence", "instances", "agents")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    workflow_type_id: str
    path_expression: str
    confidence: _common_pb2.Confidence
    instances: int
    agents: _containers.RepeatedCompositeFieldContainer[AgentProfile]
    def __init__(self, tenant: _Optional[str] = ..., workflow_type_id: _Optional[str] = ..., path_expression: _Optional[str] = ..., confidence: _Optional[_Union[_common_pb2.Confidence, str]] = ..., instances: _Optional[int] = ..., agents: _Optional[_Iterable[_Union[AgentProfile, _Mapping]]] = ...) -> None: ...

class ListWorkflowTypesRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListWorkflowTypesResponse(_message.Message):
    __slots__ = ("workflow_types",)
    WORKFLOW_TYPES_FIELD_NUMBER: _ClassVar[int]
    workflow_types: _containers.RepeatedCompositeFieldContainer[WorkflowProfile]
    def __init__(self, workflow_types: _Optional[_Iterable[_Union[WorkflowProfile, _Mapping]]] = ...) -> None: ...
