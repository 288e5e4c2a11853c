"""The CompletionRecord the gateway publishes once per accepted request (the profiler's and the
cache manager's input)."""

from __future__ import annotations

from dataclasses import dataclass

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.wire import app_metadata_to_proto
from clairvoyant.gateway.request import GenerationRequest, TokenUsage

STATUS_OK = common_pb2.REQUEST_STATUS_OK
STATUS_CANCELLED = common_pb2.REQUEST_STATUS_CANCELLED
STATUS_ERROR = common_pb2.REQUEST_STATUS_ERROR


@dataclass(frozen=True)
class Outcome:
    """How an accepted request ended, as the pipeline saw it."""

    status: common_pb2.RequestStatus  # STATUS_OK | STATUS_CANCELLED | STATUS_ERROR
    worker_id: str
    usage: TokenUsage
    scheduled_time: float  # wall clock, seconds since the epoch
    first_token_time: float  # 0 when no token arrived
    end_time: float
    finish_reason: str  # stop | length | abort | error
    error_code: str = ""
    # From the worker's last message (clairvoyant.core.blockhash); empty when it never sent one.
    prompt_block_hashes: tuple[int, ...] = ()
    response_block_hashes: tuple[int, ...] = ()
    # The prompt as the worker's engine received it (its last message; empty when it never sent
    # one) and every output token the stream carried, cancelled or failed streams included.
    prompt_token_ids: tuple[int, ...] = ()
    output_token_ids: tuple[int, ...] = ()
    annotations: common_pb2.SysAnnotations | None = None  # the profiler's, as the request was served


def build_record(
    request: GenerationRequest, outcome: Outcome, *, token_ids: bool = True
) -> common_pb2.CompletionRecord:
    """The record of ``request``; ``token_ids`` False leaves the prompt and output token ids out
    (``CV_GATEWAY_RECORD_TOKEN_IDS``): they are the bulk of a record, and the text itself."""
    record = common_pb2.CompletionRecord(
        request_id=request.request_id,
        tenant=request.tenant,
        model=request.model,
        worker_id=outcome.worker_id,
        prompt_tokens=outcome.usage.prompt_tokens,
        cached_tokens=outcome.usage.cached_tokens,
        output_tokens=outcome.usage.completion_tokens,
        timing=common_pb2.Timing(
            arrival_time=request.arrival_time,
            scheduled_time=outcome.scheduled_time,
            first_token_time=outcome.first_token_time,
            end_time=outcome.end_time,
        ),
        finish_reason=outcome.finish_reason,
        status=outcome.status,
        error_code=outcome.error_code,
        endpoint=request.endpoint,
        stream=request.stream,
        prompt_block_hashes=outcome.prompt_block_hashes,
        response_block_hashes=outcome.response_block_hashes,
    )
    if token_ids:
        record.prompt_token_ids.extend(outcome.prompt_token_ids)
        record.output_token_ids.extend(outcome.output_token_ids)
    if request.app_metadata is not None:
        record.app_metadata.CopyFrom(app_metadata_to_proto(request.app_metadata))
    if outcome.annotations is not None:
        record.annotations.CopyFrom(outcome.annotations)
    return record
