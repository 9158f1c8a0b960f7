"""Surface-neutral generation core for the /v1 surfaces.

open_generation() waits (bounded) until the bridge accepts the job, so refusals before ACCEPT
(context exceeded, queue full, engine down) become clean HTTP errors and the 200 is sent only
for a job the engine took. The returned iterator is then projected by api/projectors.py.

A stream may start earlier, at the bridge's first `queued` event (`admit_queued=True`): the
bridge decides QUEUE_FULL at submit time, so a job told its position was admitted, and its
client should learn the position (and get keepalives) while it waits rather than see nothing for
minutes. What can still go wrong after that (the queue wait timing out, the engine going down,
a context overflow found when the job reaches a slot) then goes in-band, in the surface's own
error event; a job that never waits still gets its clean 4xx.
A submit that found Redis out is made again while the request's ride-out window lasts
(api.outage), then answered 503 + Retry-After.
"""
import asyncio
import math
from collections.abc import AsyncGenerator, Callable

from django.conf import settings

from api import outage
from api.errors import ApiError, from_engine_error
from engine_bridge.request import GenerationRequest


def queue_timeout_s() -> float:
    # Well inside the SDKs' 600 s read timeout (colibri uses 300 s).
    return float(getattr(settings, "API_QUEUE_TIMEOUT", 300))


def queue_deadline() -> float:
    return asyncio.get_running_loop().time() + queue_timeout_s()


def queue_timeout_error() -> ApiError:
    return ApiError(429, "Timed out waiting in the generation queue; retry shortly.", type="rate_limit_error",
                    code="queue_timeout", headers={"Retry-After": "1"})


async def open_generation(request: GenerationRequest, *, prompt_param: str = "messages", admit_queued: bool = False,
                          deadline: float | None = None, tick: Callable[[], float] | None = None,
                          boot: str | None = None) -> tuple[dict, AsyncGenerator[dict | None, None]]:
    """-> (accepted event — or, with admit_queued, the first queued event —, async iterator of the
    remaining events). Raises ApiError; a context overflow names `prompt_param` (the surface's own
    field). `deadline` (loop time) bounds the wait; default now + queue_timeout_s(). `tick`, `boot`:
    see client.generate (the iterator then yields None when that long passes without an event).
    The returned event names the bridge that took the job (`bridge`, from its `routed` event)."""
    from engine_bridge import client

    agen = client.generate(request, tick=tick, boot=boot)
    if deadline is None:
        deadline = queue_deadline()
    bridge = None  # the bridge the router chose (its `routed` event), told to the caller with `first`
    heard = False  # whether a bridge has answered (Redis carries its events): the outage is over
    loop = asyncio.get_running_loop()
    while True:
        # A request that found Redis out waits for it no longer than its window (api.outage),
        # until a bridge answers: a try hung on a frozen Redis is cut there.
        outage_end = loop.time() + outage.left_s() if outage.riding() and not heard else math.inf
        try:
            # A timeout cancels __anext__, which ends generate() and sends gen.cancel. (A timeout
            # scope, not wait_for: no task per event.)
            async with asyncio.timeout_at(min(deadline, outage_end)):
                event = await agen.__anext__()
        except StopAsyncIteration:
            raise ApiError(500, "The engine closed the request without an answer.", type="server_error", code="engine_error")
        except asyncio.TimeoutError:
            raise outage.broker_unavailable() if outage_end < deadline else queue_timeout_error()
        if event is None:  # a tick while waiting for ACCEPT: the deadline above bounds the wait
            continue
        kind = event.get("kind")
        if kind == "routed":
            bridge = event.get("bridge")
        if kind == "accepted" or (kind == "queued" and admit_queued):
            return ({**event, "bridge": bridge} if bridge else event), agen
        if kind == "error":
            await agen.aclose()
            # Redis refused the submit or the route (nothing reached a bridge): submit again
            # while the request's ride-out window lasts (api.outage), as a chat turn does. No
            # bridge (or engine) known once it answers again counts as the same outage: a
            # restarted Redis has lost every registration until the bridges' next beat.
            if not (event.get("broker") or (outage.riding() and event.get("code") == "ENGINE_UNAVAILABLE")):
                raise from_engine_error(event, prompt_param=prompt_param)
            outage.met()
            if outage.left_s() < outage.POLL_S or loop.time() + outage.POLL_S >= deadline:
                raise outage.broker_unavailable()
            await asyncio.sleep(outage.POLL_S)
            agen, bridge, heard = client.generate(request, tick=tick, boot=boot), None, False
            continue
        if kind not in ("submitted", "routed"):  # the bridge's own events: Redis carried them
            heard = True
        # queued / submitted (the client's own first event) and unknown kinds: keep waiting.
