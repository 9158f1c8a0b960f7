"""A new /v1 request while Redis does not answer: it waits for Redis, BROKER_OUTAGE_S at most in
all, then gets its surface's 503 with Retry-After; never a 500.

Why: every step before a generation's submit can read Redis (the key generation, the rate-limit
scripts, the registry snapshot, the submit itself), and a connection error escaping one of them
became `500 internal_error` at once, while streams already running and chat turns ride a short
outage out (engine_bridge.client.BROKER_OUTAGE_S, the relay's retried submit). The key check
needs no wait (api.keycache reads the database); the others call `ride_out`, which retries the
step while Redis is out, or (the submit) retry themselves while `left_s()` allows. The window is
one per request, BROKER_OUTAGE_S from its start (`begin`), shared by all its steps: a request
that finds Redis out answers within that time of its arrival, and a try under way when it ends
is cut there (ATTEMPT_S; the submit's wait for its bridge, api.engine), so a frozen Redis holds
it no longer than a dead one, give or take a Redis socket timeout the bridge client sets.

Invariant: only what says Redis is unreachable is ridden out (BROKER_ERRORS); a script or
protocol error stays a bug (a logged 500).
"""
import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from api.errors import BROKER_ERRORS, broker_unavailable
from engine_bridge.client import BROKER_OUTAGE_S

T = TypeVar("T")

# Connection refused or reset, a timeout, Redis still loading its data after a restart
# (BusyLoadingError is a ConnectionError): the broker is out, not the request wrong.
ATTEMPT_S = 1.0  # one try's bound: a frozen Redis (SIGSTOP) never answers, a dead one refuses at once
POLL_S = 0.25    # between tries; also the shortest try


@dataclass
class _Window:
    deadline: float     # monotonic: when the request stops waiting for Redis
    met: bool = False   # whether it has found Redis out


_window: ContextVar[_Window | None] = ContextVar("broker_ride_out_window", default=None)


def begin() -> None:
    """A new request: it may wait for Redis until BROKER_OUTAGE_S after now (each request runs in a
    task of its own, with its own context)."""
    _window.set(_Window(time.monotonic() + BROKER_OUTAGE_S))


def _current() -> _Window:
    window = _window.get()
    if window is None:  # a caller that never began one: its window opens at its first failure
        window = _Window(time.monotonic() + BROKER_OUTAGE_S)
        _window.set(window)
    return window


def met() -> None:
    """This request found Redis out (a step that rides out on its own, the submit, says so)."""
    _current().met = True


def riding() -> bool:
    """Whether this request has found Redis out."""
    window = _window.get()
    return window is not None and window.met


def left_s() -> float:
    """Seconds this request may still wait for Redis."""
    return _current().deadline - time.monotonic()


async def ride_out(step: Callable[[], Awaitable[T]]) -> T:
    """step()'s answer, retried while Redis is out; raises broker_unavailable() once the request's
    window is spent. No try outlasts the window by more than the connection's own timeout."""
    while True:
        try:
            async with asyncio.timeout(min(ATTEMPT_S, max(POLL_S, left_s()))):
                return await step()
        except BROKER_ERRORS as exc:
            met()
            if left_s() < POLL_S:
                raise broker_unavailable() from exc
        await asyncio.sleep(POLL_S)
