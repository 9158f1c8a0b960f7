"""Errors of the /v1 surfaces: one exception type, rendered by the surface's own envelope.

Invariant: every failure of a /v1 route leaves as JSON in its family's envelope: OpenAI
(`{"error": {message, type, param, code}}`, all four keys always) for Chat, Completions,
Responses and Models; Anthropic (`{"type": "error", "error": {type, message}}`, 503 sent as 529
`overloaded_error`) for Messages. Unexpected exceptions become a logged 500 in the envelope,
never Django's HTML page; Redis out is a 503 with Retry-After (api.outage), never a 500. Messages are written for API clients: the bridge's chat-page wording
is never passed through (api_engine_message).
"""
import logging
from typing import Any

import redis
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response

from engine_bridge.client import BROKER_RETRY_S

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}
        self.extra = extra or {}



def bad_param(param: str | None, message: str) -> ApiError:
    return ApiError(400, message, param=param)


def unavailable(message: str = "The engine is starting or restarting; retry shortly.",
                retry_after: int = 5) -> ApiError:
    return ApiError(503, message, type="server_error", code="engine_unavailable",
                    headers={"Retry-After": str(retry_after)})


# What an API client reads for each bridge error code. The bridge's own text is written for the
# chat page ("your partial reply was kept"), so only CONTEXT_EXCEEDED / BAD_REQUEST details pass.
_ENGINE_TEXT = {
    "ENGINE_DIED": "The engine stopped unexpectedly; the response is incomplete. Retry the request.",
    "ENGINE_UNAVAILABLE": "The engine is not available (starting, restarting or stopped); retry shortly.",
    "QUEUE_FULL": "The server is busy (generation queue full); retry shortly.",
    "CANCELLED": "The request was cancelled.",
    "ENGINE_ERROR": "The engine failed while generating; the response is incomplete.",
}


def api_engine_message(event: dict) -> str:
    code = event.get("code") or "ENGINE_ERROR"
    return _ENGINE_TEXT.get(code) or f"The engine refused the request ({code})."


def from_engine_error(event: dict, *, prompt_param: str = "messages") -> ApiError:
    """Maps a bridge `error` event seen before the stream started to an HTTP error."""
    code = event.get("code") or "ENGINE_ERROR"
    if code == "CONTEXT_EXCEEDED":
        n, limit = event.get("n"), event.get("limit")
        return ApiError(
            400,
            f"This model's maximum context length is {limit} tokens, however your request resulted in at least {n} tokens.",
            param=prompt_param, code="context_length_exceeded", extra={"n_prompt_tokens": n, "n_ctx": limit},
        )
    if code == "QUEUE_FULL":
        return ApiError(429, api_engine_message(event), type="rate_limit_error", code="queue_full",
                        headers={"Retry-After": "1"})
    if code == "ENGINE_UNAVAILABLE":
        # The bridge says when the engine should be back (its restart backoff); at least 1 s.
        retry = event.get("retry_after")
        retry = max(1, int(retry)) if isinstance(retry, (int, float)) and retry == retry and retry < 3600 else 2
        return unavailable(api_engine_message(event), retry_after=retry)
    if code == "BAD_REQUEST":
        return ApiError(400, "The engine refused the request: " + str(event.get("message") or ""), code="bad_request")
    return ApiError(500, api_engine_message(event), type="server_error", code="engine_error")


class OpenAIEnvelope:
    """Chat, Completions, Responses, Models."""

    def status(self, err: ApiError) -> int:
        return err.status

    def body(self, err: ApiError) -> dict[str, Any]:
        return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code, **err.extra}}

    def stream_error(self, message: str, err: ApiError | None = None) -> dict[str, Any]:
        if err is not None:  # an error found before ACCEPT, after the stream started (queued jobs)
            return {"error": {"message": message, "type": err.type, "param": err.param, "code": err.code}}
        return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}


class AnthropicEnvelope:
    """Messages. Engine-not-ready is the family's 529 overloaded_error (both retried by the SDK)."""

    def status(self, err: ApiError) -> int:
        return 529 if err.status == 503 else err.status

    def body(self, err: ApiError) -> dict[str, Any]:
        status = self.status(err)
        kind = _ANTHROPIC_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}

    def stream_error(self, message: str, kind: str = "api_error") -> dict[str, Any]:
        return {"type": "error", "error": {"type": kind, "message": message}}


Envelope = OpenAIEnvelope | AnthropicEnvelope
OPENAI = OpenAIEnvelope()
ANTHROPIC = AnthropicEnvelope()


_DRF_MAP: dict[type[exceptions.APIException], tuple[int, str, str | None]] = {
    exceptions.NotAuthenticated: (401, "authentication_error", "invalid_api_key"),
    exceptions.AuthenticationFailed: (401, "authentication_error", "invalid_api_key"),
    exceptions.PermissionDenied: (403, "permission_error", None),
    exceptions.NotFound: (404, "invalid_request_error", "not_found"),
    exceptions.MethodNotAllowed: (405, "invalid_request_error", "method_not_allowed"),
    exceptions.ParseError: (400, "invalid_request_error", None),
    exceptions.Throttled: (429, "rate_limit_error", "rate_limited"),
}


def as_api_error(exc: BaseException) -> ApiError:
    """Any exception a /v1 view raised -> ApiError (unexpected ones logged, as a 500)."""
    if isinstance(exc, ApiError):
        return exc
    for cls, (status, type_, code) in _DRF_MAP.items():
        if isinstance(exc, cls):
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            wait = getattr(exc, "wait", None)  # Throttled's
            if status == 429 and wait:
                headers["Retry-After"] = str(max(1, int(wait)))
            return ApiError(status, str(exc.detail), type=type_, code=code, headers=headers)
    if isinstance(exc, exceptions.APIException):
        return ApiError(exc.status_code, str(exc.detail))
    if isinstance(exc, Http404):
        return ApiError(404, "Not found.", code="not_found")
    if isinstance(exc, BROKER_ERRORS):  # a Redis read no step rode out: come back, not a 500
        log.warning("Redis out under a /v1 view: %r", exc)
        return broker_unavailable()
    log.exception("unexpected error in a /v1 view", exc_info=exc)
    return ApiError(500, "Internal server error.", type="server_error", code="internal_error")


# What says Redis is unreachable (api.outage rides these out; nothing else is ridden out).
BROKER_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError, TimeoutError)


def broker_unavailable() -> ApiError:
    return ApiError(503, "The service cannot reach its message broker right now; retry shortly.",
                    type="server_error", code="service_unavailable", headers={"Retry-After": str(BROKER_RETRY_S)})


def render(envelope: "Envelope", err: ApiError) -> Response:
    headers = dict(err.headers)
    retry = headers.get("Retry-After")
    if retry and retry.isdigit():
        headers.setdefault("retry-after-ms", str(int(retry) * 1000))  # both SDKs read this first
    return Response(envelope.body(err), status=envelope.status(err), headers=headers)
