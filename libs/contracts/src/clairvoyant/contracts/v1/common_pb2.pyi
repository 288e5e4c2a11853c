from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Confidence(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONFIDENCE_UNSPECIFIED: _ClassVar[Confidence]
    CONFIDENCE_NONE: _ClassVar[Confidence]
    CONFIDENCE_SHADOW: _ClassVar[Confidence]
    CONFIDENCE_LOW: _ClassVar[Confidence]
    CONFIDENCE_HIGH: _ClassVar[Confidence]

class RequestStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATUS_UNSPECIFIED: _ClassVar[RequestStatus]
    REQUEST_STATUS_OK: _ClassVar[RequestStatus]
    REQUEST_STATUS_CANCELLED: _ClassVar[RequestStatus]
    REQUEST_STATUS_ERROR: _ClassVar[RequestStatus]
CONFIDENCE_UNSPECIFIED: Confidence
CONFIDENCE_NONE: Confidence
CONFIDENCE_SHADOW: Confidence
CONFIDENCE_LOW: Confidence
CONFIDENCE_HIGH: Confidence
REQUEST_STATUS_UNSPECIFIED: RequestStatus
REQUEST_STATUS_OK: RequestStatus
REQUEST_STATUS_CANCELLED: RequestStatus
REQUEST_STATUS_ERROR: RequestStatus

class AppMetadata(_message.Message):
    __slots__ = ("workflow_type_id", "workflow_id", "agent_id", "upstream_agent_id", "parent_request_ids", "tool", "workflow_version", "workflow_end")
    WORKFLOW_TYPE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_END_FIELD_NUMBER: _ClassVar[int]
    workflow_type_id: str
    workflow_id: str
    agent_id: str
    upstream_agent_id: str
    parent_request_ids: _containers.RepeatedScalarFieldContainer[str]
    tool: str
    workflow_version: str
    workflow_end: bool
    def __init__(self, workflow_type_id: _Optional[str] = ..., workflow_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., upstream_agent_id: _Optional[str] = ..., parent_request_ids: _Optional[_Iterable[str]] = ..., tool: _Optional[str] = ..., workflow_version: _Optional[str] = ..., workflow_end: _Optional[bool] = ...) -> None: ...

class LengthInterval(_message.Message):
    __slots__ = ("p50", "p99")
    P50_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    p50: float
    p99: float
    def __init__(self, p50: _Optional[float] = ..., p99: _Optional[float] = ...) -> None: ...

class NextAgent(_message.Message):
    __slots__ = ("agent_id", "probability")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    probability: float
    def __init__(self, agent_id: _Optional[str] = ..., probability: _Optional[float] = ...) -> None: ...

class SysAnnotations(_message.Message):
    __slots__ = ("predicted_output_len", "predicted_path_regex", "expected_remaining_steps", "expected_remaining_time_s", "next_agents", "prompt_composition", "confidence", "kairos_rank", "attained_service_s", "projection", "remaining_gittins_index")
    PREDICTED_OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_PATH_REGEX_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REMAINING_STEPS_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REMAINING_TIME_S_FIELD_NUMBER: _ClassVar[int]
    NEXT_AGENTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_COMPOSITION_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    KAIROS_RANK_FIELD_NUMBER: _ClassVar[int]
    ATTAINED_SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    PROJECTION_FIELD_NUMBER: _ClassVar[int]
    REMAINING_GITTINS_INDEX_FIELD_NUMBER: _ClassVar[int]
    predicted_output_len: LengthInterval
    predicted_path_regex: str
    expected_remaining_steps: float
    expected_remaining_time_s: float
    next_agents: _containers.RepeatedCompositeFieldContainer[NextAgent]
    prompt_composition: str
    confidence: Confidence
    kairos_rank: float
    attained_service_s: float
    projection: _containers.RepeatedCompositeFieldContainer[ProjectedCalls]
    remaining_gittins_index: float
    def __init__(self, predicted_output_len: _Optional[_Union[LengthInterval, _Mapping]] = ..., predicted_path_regex: _Optional[str] = ..., expected_remaining_steps: _Optional[float] = ..., expected_remaining_time_s: _Optional[float] = ..., next_agents: _Optional[_Iterable[_Union[NextAgent, _Mapping]]] = ..., prompt_composition: _Optional[str] = ..., confidence: _Optional[_Union[Confidence, str]] = ..., kairos_rank: _Optional[float] = ..., attained_service_s: _Optional[float] = ..., projection: _Optional[_Iterable[_Union[ProjectedCalls, _Mapping]]] = ..., remaining_gittins_index: _Optional[float] = ...) -> None: ...

class ProjectedCalls(_message.Message):
    __slots__ = ("step", "agent_id", "expected_calls")
    STEP_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CALLS_FIELD_NUMBER: _ClassVar[int]
    step: int
    agent_id: str
    expected_calls: float
    def __init__(self, step: _Optional[int] = ..., agent_id: _Optional[str] = ..., expected_calls: _Optional[float] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop", "ignore_eos", "min_tokens", "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "logprobs", "constraint", "n")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    min_tokens: int
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    logprobs: int
    constraint: OutputConstraint
    n: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., logprobs: _Optional[int] = ..., constraint: _Optional[_Union[OutputConstraint, _Mapping]] = ..., n: _Optional[int] = ...) -> None: ...

class OutputConstraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "ebnf", "choice", "structural_tag")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    EBNF_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    STRUCTURAL_TAG_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    ebnf: str
    choice: ChoiceList
    structural_tag: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., ebnf: _Optional[str] = ..., choice: _Optional[_Union[ChoiceList, _Mapping]] = ..., structural_tag: _Optional[str] = ...) -> None: ...

class ChoiceList(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function_name")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        AUTO: _ClassVar[ToolChoice.Mode]
        NONE: _ClassVar[ToolChoice.Mode]
        REQUIRED: _ClassVar[ToolChoice.Mode]
        FUNCTION: _ClassVar[ToolChoice.Mode]
    AUTO: ToolChoice.Mode
    NONE: ToolChoice.Mode
    REQUIRED: ToolChoice.Mode
    FUNCTION: ToolChoice.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoice.Mode
    function_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoice.Mode, str]] = ..., function_name: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("arrival_time", "scheduled_time", "first_token_time", "end_time")
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    arrival_time: float
    scheduled_time: float
    first_token_time: float
    end_time: float
    def __init__(self, arrival_time: _Optional[float] = ..., scheduled_time: _Optional[float] = ..., first_token_time: _Optional[float] = ..., end_time: _Optional[float] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("message", "type", "param", "code", "retry_after_s")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    message: str
    type: str
    param: str
    code: str
    retry_after_s: float
    def __init__(self, message: _Optional[str] = ..., type: _Optional[str] = ..., param: _Optional[str] = ..., code: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class CompletionRecord(_message.Message):
    __slots__ = ("request_id", "tenant", "app_metadata", "model", "worker_id", "prompt_tokens", "cached_tokens", "output_tokens", "timing", "finish_reason", "status", "error_code", "endpoint", "stream", "prompt_block_hashes", "response_block_hashes", "prompt_token_ids", "output_token_ids", "annotations")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    tenant: str
    app_metadata: AppMetadata
    model: str
    worker_id: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    timing: Timing
    finish_reason: str
    status: RequestStatus
    error_code: str
    endpoint: str
    stream: bool
    prompt_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    response_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    annotations: SysAnnotations
    def __init__(self, request_id: _Optional[str] = ..., tenant: _Optional[str] = ..., app_metadata: _Optional[_Union[AppMetadata, _Mapping]] = ..., model: _Optional[str] = ..., worker_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., finish_reason: _Optional[str] = ..., status: _Optional[_Union[RequestStatus, str]] = ..., error_code: _Optional[str] = ..., endpoint: _Optional[str] = ..., stream: _Optional[bool] = ..., prompt_block_hashes: _Optional[_Iterable[int]] = ..., response_block_hashes: _Optional[_Iterable[int]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., annotations: _Optional[_Union[SysAnnotations, _Mapping]] = ...) -> None: ...
