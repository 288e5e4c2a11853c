"""The error hierarchy shared by every service.

Core code raises these; only the edges map them: to OpenAI-style JSON over HTTP
(``{"error": {"message", "type", "param", "code"}}``) and to gRPC status codes, with the same
fields attached as ``ErrorDetail`` in the binary trailer ``cv-error-bin``.
"""

from __future__ import annotations

import grpc

from clairvoyant.contracts.v1 import common_pb2

ERROR_TRAILER = "cv-error-bin"


class ClairvoyantError(Exception):
    """Base class.  Subclasses fix the HTTP status, OpenAI error type and gRPC code."""

    http_status = 500
    error_type = "internal_error"
    grpc_code = grpc.StatusCode.INTERNAL
    default_code = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        self.retry_after_s = retry_after_s

    def to_openai(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    def to_detail(self) -> common_pb2.ErrorDetail:
        detail = common_pb2.ErrorDetail(
            message=self.message, type=self.error_type, param=self.param or "", code=self.code
        )
        if self.retry_after_s is not None:
            detail.retry_after_s = self.retry_after_s
        return detail


class InvalidRequest(ClairvoyantError):
    http_status = 400
    error_type = "invalid_request_error"
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    default_code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class PayloadTooLarge(InvalidRequest):
    http_status = 413
    default_code = "request_too_large"


class Unauthenticated(ClairvoyantError):
    http_status = 401
    error_type = "authentication_error"
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    default_code = "invalid_api_key"


class ModelNotFound(ClairvoyantError):
    http_status = 404
    error_type = "not_found_error"
    grpc_code = grpc.StatusCode.NOT_FOUND
    default_code = "model_not_found"


class QueueFull(ClairvoyantError):
    http_status = 429
    error_type = "rate_limit_error"
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    default_code = "queue_full"


class NoWorkers(ClairvoyantError):
    http_status = 503
    error_type = "service_unavailable"
    grpc_code = grpc.StatusCode.UNAVAILABLE
    default_code = "no_workers"


class Unavailable(ClairvoyantError):
    """A dependency is down or timed out."""

    http_status = 503
    error_type = "service_unavailable"
    grpc_code = grpc.StatusCode.UNAVAILABLE
    default_code = "unavailable"


_BY_GRPC: dict[grpc.StatusCode, type[ClairvoyantError]] = {
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
        cls = _BY_CODE.get(detail.code) or _BY_GRPC.get(code, ClairvoyantError)
        retry = detail.retry_after_s if detail.HasField("retry_after_s") else None
        return cls(detail.message, param=detail.param or None, code=detail.code or None, retry_after_s=retry)
    cls = _BY_GRPC.get(code, Unavailable)
    return cls(f"{code.name.lower()}: {details}")
