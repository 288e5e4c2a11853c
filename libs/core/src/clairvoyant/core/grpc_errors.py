"""The gRPC edge of the error hierarchy (``clairvoyant.core.errors``).

A server ends a call with ``abort``: the error's status code and its fields as an ``ErrorDetail``
in the binary trailer ``cv-error-bin``.  A client rebuilds the typed error with ``from_rpc_error``.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from clairvoyant.contracts.v1 import common_pb2
from clairvoyant.core.errors import (
    ClairvoyantError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    NoWorkers,
    PayloadTooLarge,
    QueueFull,
    Unauthenticated,
    Unavailable,
)

ERROR_TRAILER = "cv-error-bin"

# An error's status code follows its HTTP status, as google.rpc.Code pairs the two (a body too
# large is a bad argument too); any other status is INTERNAL.
_STATUS_BY_HTTP: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
# What a client rebuilds: by the detail's code where it names a subclass, else by status code.
_BY_STATUS: dict[grpc.StatusCode, type[ClairvoyantError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.NOT_FOUND: ModelNotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QueueFull,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
}
_BY_CODE: dict[str, type[ClairvoyantError]] = {
    "context_length_exceeded": ContextLengthExceeded,
    "request_too_large": PayloadTooLarge,
    "no_workers": NoWorkers,
}


def status_code(err: ClairvoyantError) -> grpc.StatusCode:
    return _STATUS_BY_HTTP.get(err.http_status, grpc.StatusCode.INTERNAL)


def to_detail(err: ClairvoyantError) -> common_pb2.ErrorDetail:
    detail = common_pb2.ErrorDetail(message=err.message, type=err.error_type, param=err.param or "", code=err.code)
    if err.retry_after_s is not None:
        detail.retry_after_s = err.retry_after_s
    return detail


async def abort(context: grpc.aio.ServicerContext, err: ClairvoyantError) -> NoReturn:
    """End the call with ``err``'s status code and its ErrorDetail in the ``cv-error-bin`` trailer."""
    context.set_trailing_metadata(((ERROR_TRAILER, to_detail(err).SerializeToString()),))
    await context.abort(status_code(err), err.message)
    raise AssertionError("unreachable")  # context.abort raises


def from_rpc_error(err: grpc.RpcError) -> ClairvoyantError:
    """Rebuild the typed error a downstream gRPC service raised (falls back on the status code)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    detail = None
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == ERROR_TRAILER and isinstance(value, bytes):
            detail = common_pb2.ErrorDetail.FromString(value)
    if detail is not None:
        cls = _BY_CODE.get(detail.code) or _BY_STATUS.get(code, ClairvoyantError)
        retry = detail.retry_after_s if detail.HasField("retry_after_s") else None
        return cls(detail.message, param=detail.param or None, code=detail.code or None, retry_after_s=retry)
    cls = _BY_STATUS.get(code, Unavailable)
    return cls(f"{code.name.lower()}: {details}")
