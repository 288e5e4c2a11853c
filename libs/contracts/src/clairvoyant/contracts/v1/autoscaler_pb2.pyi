from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AutoscalerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelReplicas(_message.Message):
    __slots__ = ("model", "current", "target", "draining")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    model: str
    current: int
    target: int
    draining: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., current: _Optional[int] = ..., target: _Optional[int] = ..., draining: _Optional[_Iterable[str]] = ...) -> None: ...

class AutoscalerStatus(_message.Message):
    __slots__ = ("policy", "models")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    models: _containers.RepeatedCompositeFieldContainer[ModelReplicas]
    def __init__(self, policy: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelReplicas, _Mapping]]] = ...) -> None: ...

class ScalingPlanRequest(_message.Message):
    __slots__ = ("horizon_s",)
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    horizon_s: float
    def __init__(self, horizon_s: _Optional[float] = ...) -> None: ...

class ScalingDecision(_message.Message):
    __slots__ = ("model", "target_replicas", "drain_workers", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TARGET_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DRAIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    target_replicas: int
    drain_workers: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, model: _Optional[str] = ..., target_replicas: _Optional[int] = ..., drain_workers: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ScalingPlan(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[ScalingDecision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[ScalingDecision, _Mapping]]] = ...) -> None: ...
