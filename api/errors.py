"""OpenAI error envelopes: one exception type, one DRF exception handler, one engine mapping."""
from rest_framework import exceptions
from rest_framework.response import Response


class ApiError(Exception):
    def __init__(self, status, message, *, type="invalid_request_error", param=None, code=None, headers=None, extra=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self):
        # Always all four keys (the SDK reads type/param/code).
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code, **self.extra}}


def bad_param(param, message):
    return ApiError(400, message, param=param)


def from_engine_error(event):
    """Maps a bridge `error` event seen before the stream started to an HTTP error."""
    code, message = event.get("code") or "ENGINE_ERROR", event.get("message") or ""
    if code == "CONTEXT_EXCEEDED":
        n, limit = event.get("n"), event.get("limit")
        return ApiError(
            400,
            f"This model's maximum context length is {limit} tokens, however your messages resulted in at least {n} tokens.",
            param="messages", code="context_length_exceeded", extra={"n_prompt_tokens": n, "n_ctx": limit},
        )
    if code == "QUEUE_FULL":
        return ApiError(429, "the server is busy (generation queue full)", type="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
    if code == "ENGINE_UNAVAILABLE":
        return ApiError(503, "the engine is not available: " + message, type="server_error", code="engine_unavailable", headers={"Retry-After": "5"})
    if code == "BAD_REQUEST":
        return ApiError(400, "the engine refused the request: " + message, code="bad_request")
    return ApiError(500, f"engine error ({code}): {message}", type="server_error", code="engine_error")


def stream_error_body(message):
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


_DRF_MAP = {
    exceptions.NotAuthenticated: (401, "authentication_error", "invalid_api_key"),
    exceptions.AuthenticationFailed: (401, "authentication_error", "invalid_api_key"),
    exceptions.PermissionDenied: (403, "permission_error", None),
    exceptions.NotFound: (404, "invalid_request_error", "not_found"),
    exceptions.MethodNotAllowed: (405, "invalid_request_error", "method_not_allowed"),
    exceptions.ParseError: (400, "invalid_request_error", None),
    exceptions.Throttled: (429, "rate_limit_error", "rate_limited"),
}


def openai_exception_handler(exc, context):
    if isinstance(exc, ApiError):
        return Response(exc.body(), status=exc.status, headers=exc.headers)
    for cls, (status, type_, code) in _DRF_MAP.items():
        if isinstance(exc, cls):
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            return Response(ApiError(status, str(exc.detail), type=type_, code=code).body(), status=status, headers=headers)
    if isinstance(exc, exceptions.APIException):
        return Response(ApiError(exc.status_code, str(exc.detail)).body(), status=exc.status_code)
    return None  # unexpected: Django's 500 (logged)
