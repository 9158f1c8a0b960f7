"""A new /v1 request while Redis does not answer: it waits for Redis, BROKER_OUTAGE_S at most in
all, then gets its surface's 503 with Retry-After; never a 500.

Why: every step before a generation's submit can read Redis (the key generation, the rate-limit
scripts, the registry snapshot, the submit itself), and a connection error escaping one of them
became `500 internal_error` at once, while streams already running and chat turns ride a short
outage out (engine_bridge.client.BROKER_OUTAGE_S, the relay's retried submit). The key check
needs no wait (api.keycache reads the database); the others call `ride_out`, which retries the
step while Redis is out. The ride-out window is one per request: it opens at the request's first
failed Redis call (`begin` resets it when a request starts) and every later step of that request
waits only for what is left of it, so a request answers within BROKER_OUTAGE_S (plus one
attempt) of its first failure whatever the number of steps.

Invariant: only what says Redis is unreachable is ridden out (BROKER_ERRORS); a script or
protocol error stays a bug (a logged 500).
"""
import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TypeVar

import redis

from api.errors import ApiError
from engine_bridge.client import BROKER_OUTAGE_S, BROKER_RETRY_S

T = TypeVar("T")

# Connection refused or reset, a timeout, Redis still loading its data after a restart
# (BusyLoadingError is a ConnectionError): the broker is out, not the request wrong.
BROKER_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError, TimeoutError)
ATTEMPT_S = 1.0  # one try's bound: a frozen Redis (SIGSTOP) never answers, a dead one refuses at once
POLL_S = 0.25    # between tries

_deadline: ContextVar[float | None] = ContextVar("broker_ride_out_deadline", default=None)


def begin() -> None:
    """A new request: no ride-out window yet (each request runs in a task, with its own context)."""
    _deadline.set(None)


def broker_unavailable() -> ApiError:
    return ApiError(503, "The service cannot reach its message broker right now; retry shortly.",
                    type="server_error", code="service_unavailable", headers={"Retry-After": str(BROKER_RETRY_S)})


def riding() -> bool:
    """Whether this request has met Redis out (its window is open)."""
    return _deadline.get() is not None


def left_s() -> float:
    """Seconds this request may still wait for Redis (the full window before its first failure)."""
    deadline = _deadline.get()
    if deadline is None:
        deadline = time.monotonic() + BROKER_OUTAGE_S
        _deadline.set(deadline)
    return deadline - time.monotonic()


async def ride_out(step: Callable[[], Awaitable[T]]) -> T:
    """step()'s answer, retried while Redis is out; raises broker_unavailable() once the request's
    window is spent."""
    while True:
        try:
            async with asyncio.timeout(ATTEMPT_S):
                return await step()
        except BROKER_ERRORS as exc:
            if left_s() < POLL_S:
                raise broker_unavailable() from exc
        await asyncio.sleep(POLL_S)
