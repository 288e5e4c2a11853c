"""The wire messages of one request: its ScheduleRequest and its Worker GenerateRequest."""

from __future__ import annotations

from clairvoyant.contracts.v1 import common_pb2, scheduler_pb2, worker_pb2
from clairvoyant.core.errors import InvalidRequest
from clairvoyant.core.wire import (
    app_metadata_to_proto,
    tool_call_to_proto,
    tool_choice_to_proto,
    tool_to_proto,
)
from clairvoyant.gateway.request import GenerationRequest


def encode_messages(
    request: GenerationRequest,
    annotations: common_pb2.SysAnnotations | None,
    prompt_tokens: int,
    owner: str,
    *,
    input_text: str = "",
) -> tuple[scheduler_pb2.ScheduleRequest, worker_pb2.GenerateRequest]:
    """The Schedule and Generate messages of ``request`` (the Generate one without its placement's
    fields); ``input_text`` for a model group's call.  Raises InvalidRequest for text protobuf
    cannot encode (a lone UTF-16 surrogate)."""
    try:
        schedule = scheduler_pb2.ScheduleRequest(
            request_id=request.request_id,
            tenant=request.tenant,
            model=request.model,
            prompt_tokens=prompt_tokens,
            max_tokens=request.sampling.max_tokens or 0,
            owner=owner,
            input_text=input_text,
        )
        generate = worker_pb2.GenerateRequest(
            request_id=request.request_id,
            model=request.model,
            sampling=request.sampling.to_proto(),
            tenant=request.tenant,
        )
        if request.chat is not None:
            turns = [
                common_pb2.ChatMessage(
                    role=t.role, content=t.content, name=t.name, tool_call_id=t.tool_call_id,
                    tool_calls=[tool_call_to_proto(call) for call in t.tool_calls],
                )  # fmt: skip
                for t in request.chat
            ]
            generate.chat.CopyFrom(worker_pb2.ChatMessages(messages=turns))
        else:
            generate.prompt = request.prompt or ""
        if request.tools:
            generate.tools.extend(tool_to_proto(tool) for tool in request.tools)
            if request.tool_choice is not None:
                generate.tool_choice.CopyFrom(tool_choice_to_proto(request.tool_choice))
            generate.parallel_tool_calls = request.parallel_tool_calls
        if request.app_metadata is not None:
            schedule.app_metadata.CopyFrom(app_metadata_to_proto(request.app_metadata))
            generate.app_metadata.CopyFrom(schedule.app_metadata)
        if annotations is not None:
            schedule.annotations.CopyFrom(annotations)
            generate.annotations.CopyFrom(annotations)
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"the request holds text that is not valid Unicode ({exc.reason}: {exc.object[exc.start : exc.end]!a})",
            code="invalid_encoding",
        ) from None
    return schedule, generate


def placed_generate_request(
    generate_msg: worker_pb2.GenerateRequest, placement: scheduler_pb2.Placement
) -> worker_pb2.GenerateRequest:
    """The Generate message for one placement: the model the placement runs (a model group's call
    names the group until then), and what the worker's engine rule reads from the scheduler (the
    base priority, the preset, the program's waiting and service time)."""
    msg = worker_pb2.GenerateRequest()
    msg.CopyFrom(generate_msg)
    if placement.model:  # "" from a scheduler that predates Placement.model: the request's own
        msg.model = placement.model
    msg.base_priority = placement.base_priority
    msg.scheduler_preset = placement.preset
    msg.program_wait_s = placement.program_wait_s
    msg.program_service_s = placement.program_service_s
    msg.seat_limit = placement.seat_limit
    return msg
