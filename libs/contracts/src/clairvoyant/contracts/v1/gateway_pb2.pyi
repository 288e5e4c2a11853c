from clairvoyant.contracts.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatCompletionRequest(_message.Message):
    __slots__ = ("model", "messages", "sampling", "app_metadata", "include_usage", "echo_annotations", "tools", "tool_choice", "parallel_tool_calls")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    APP_METADATA_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_USAGE_FIELD_NUMBER: _ClassVar[int]
    ECHO_ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    sampling: _common_pb2.SamplingParams
    app_metadata: _common_pb2.AppMetadata
    include_usage: bool
    echo_annotations: bool
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.Tool]
    tool_choice: _common_pb2.ToolChoice
    parallel_tool_calls: bool
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., app_metadata: _Optional[_Union[_common_pb2.AppMetadata, _Mapping]] = ..., include_usage: _Optional[bool] = ..., echo_annotations: _Optional[bool] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_common_pb2.ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ...) -> None: ...

class ChatChoice(_message.Message):
    __slots__ = ("index", "content", "finish_reason", "tool_calls", "logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    content: str
    finish_reason: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    def __init__(self, index: _Optional[int] = ..., content: _Optional[str] = ..., finish_reason: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ...) -> None: ...

class ChatCompletionResponse(_message.Message):
    __slots__ = ("id", "model", "created", "content", "finish_reason", "usage", "annotations", "logprobs", "tool_calls", "choices")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    created: int
    content: str
    finish_reason: str
    usage: _common_pb2.Usage
    annotations: _common_pb2.SysAnnotations
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCall]
    choices: _containers.RepeatedCompositeFieldContainer[ChatChoice]
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., created: _Optional[int] = ..., content: _Optional[str] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCall, _Mapping]]] = ..., choices: _Optional[_Iterable[_Union[ChatChoice, _Mapping]]] = ...) -> None: ...

class ChatCompletionChunk(_message.Message):
    __slots__ = ("id", "model", "created", "delta", "finish_reason", "usage", "annotations", "logprobs", "index", "tool_calls")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    created: int
    delta: str
    finish_reason: str
    usage: _common_pb2.Usage
    annotations: _common_pb2.SysAnnotations
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    index: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolCallDelta]
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., created: _Optional[int] = ..., delta: _Optional[str] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., annotations: _Optional[_Union[_common_pb2.SysAnnotations, _Mapping]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., index: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[_common_pb2.ToolCallDelta, _Mapping]]] = ...) -> None: ...
