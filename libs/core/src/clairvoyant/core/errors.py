"""The error hierarchy shared by every service: plain exceptions, no transport.

Core code raises these; only the edges map them: the HTTP edge (the gateway) to ``http_status``
and OpenAI-style JSON (``{"error": {"message", "type", "param", "code"}}``), the gRPC edges to a
status code and an ``ErrorDetail`` trailer (``clairvoyant.core.grpc_errors``).
"""

from __future__ import annotations


class ClairvoyantError(Exception):
    """Base class.  Subclasses fix the HTTP status, the OpenAI error type and the default code."""

    http_status = 500
    error_type = "internal_error"
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


class InvalidRequest(ClairvoyantError):
    http_status = 400
    error_type = "invalid_request_error"
    default_code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class PayloadTooLarge(InvalidRequest):
    http_status = 413
    default_code = "request_too_large"


class Unauthenticated(ClairvoyantError):
    http_status = 401
    error_type = "authentication_error"
    default_code = "invalid_api_key"


class ModelNotFound(ClairvoyantError):
    http_status = 404
    error_type = "not_found_error"
    default_code = "model_not_found"


class QueueFull(ClairvoyantError):
    http_status = 429
    error_type = "rate_limit_error"
    default_code = "queue_full"


class NoWorkers(ClairvoyantError):
    http_status = 503
    error_type = "service_unavailable"
    default_code = "no_workers"


class Unavailable(ClairvoyantError):
    """A dependency is down or timed out."""

    http_status = 503
    error_type = "service_unavailable"
    default_code = "unavailable"
