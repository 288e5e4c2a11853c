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
    __slots__ = ("model", "current", "target", "draining", "starting", "gpus_per_replica")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    STARTING_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_REPLICA_FIELD_NUMBER: _ClassVar[int]
    model: str
    current: int
    target: int
    draining: _containers.RepeatedScalarFieldContainer[str]
    starting: _containers.RepeatedScalarFieldContainer[str]
    gpus_per_replica: int
    def __init__(self, model: _Optional[str] = ..., current: _Optional[int] = ..., target: _Optional[int] = ..., draining: _Optional[_Iterable[str]] = ..., starting: _Optional[_Iterable[str]] = ..., gpus_per_replica: _Optional[int] = ...) -> None: ...

class AutoscalerStatus(_message.Message):
    __slots__ = ("policy", "models", "gpu_budget", "gpus_in_use", "failed_starts_total", "last_tick_age_s", "actuator")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    GPU_BUDGET_FIELD_NUMBER: _ClassVar[int]
    GPUS_IN_USE_FIELD_NUMBER: _ClassVar[int]
    FAILED_STARTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_TICK_AGE_S_FIELD_NUMBER: _ClassVar[int]
    ACTUATOR_FIELD_NUMBER: _ClassVar[int]
    policy: str
    models: _containers.RepeatedCompositeFieldContainer[ModelReplicas]
    gpu_budget: int
    gpus_in_use: int
    failed_starts_total: int
    last_tick_age_s: float
    actuator: str
    def __init__(self, policy: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelReplicas, _Mapping]]] = ..., gpu_budget: _Optional[int] = ..., gpus_in_use: _Optional[int] = ..., failed_starts_total: _Optional[int] = ..., last_tick_age_s: _Optional[float] = ..., actuator: _Optional[str] = ...) -> None: ...

class ScalingPlanRequest(_message.Message):
    __slots__ = ("horizon_s", "horizon_steps")
    HORIZON_S_FIELD_NUMBER: _ClassVar[int]
    HORIZON_STEPS_FIELD_NUMBER: _ClassVar[int]
    horizon_s: float
    horizon_steps: int
    def __init__(self, horizon_s: _Optional[float] = ..., horizon_steps: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("decisions", "diagnostics")
    class DiagnosticsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[ScalingDecision]
    diagnostics: _containers.ScalarMap[str, float]
    def __init__(self, decisions: _Optional[_Iterable[_Union[ScalingDecision, _Mapping]]] = ..., diagnostics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ScalingEvent(_message.Message):
    __slots__ = ("kind", "replica_id", "model", "time", "reason")
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    replica_id: str
    model: str
    time: float
    reason: str
    def __init__(self, kind: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., time: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...
