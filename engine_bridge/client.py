"""The surface-neutral generation client (chat websocket, OpenAI API, ... all use this).

    async with contextlib.aclosing(generate(GenerationRequest(prompt=..., max_tokens=64))) as events:
        async for event in events:
            ...   # first {"kind": "submitted", "req": <id>}, then the bridge's events (docs/contracts.md)

Leaving the iterator early (break + aclose, exception, task cancelled) sends gen.cancel.
"""
import asyncio
import logging
import uuid
from dataclasses import asdict, dataclass, field

from engine_bridge import liveness, protocol, transport

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0   # nothing from the bridge for this long while not queued -> ENGINE_UNAVAILABLE
GAP_TIMEOUT = 2.0      # a missing seq not filled within this long -> the stream is broken
DRAIN_TIMEOUT = IDLE_TIMEOUT + 30.0  # receiver gives up after this long without a batch
FINAL_KINDS = ("done", "error")
LIVENESS_POLL = 1.0    # nothing arrived for this long: is the bridge that took the job still alive?
BROKER_RETRY_S = 2     # Retry-After while Redis cannot be reached


@dataclass
class GenerationRequest:
    prompt: str                      # fully rendered prompt (the caller renders the chat template)
    max_tokens: int
    temperature: float | None = 0.0  # 0 = greedy; None = the served model's default (sampling.model_defaults)
    top_p: float | None = 1.0        # None = the served model's default
    seed: int | None = None          # sent as seed=<n> to engines with our extensions (MODEL line)
    stop: list[str] = field(default_factory=list)
    conversation_key: str | None = None
    priority: str = "interactive"    # or "background"
    topk: bool = False
    experts: int | None = None       # routed experts per token (our engine's experts=N); None = the model's own
    routes: bool = False             # ask for this request's expert selection counts (done.routing)
    heat: bool = True                # False: the engine keeps these selections out of its usage heat


def _error(code, message, **extra):
    return {"kind": "error", "code": code, "message": message, **extra}


def _broker_down(exc):
    return _error("ENGINE_UNAVAILABLE", f"The message broker (Redis) cannot be reached: {exc}",
                  retry_after=BROKER_RETRY_S)


async def generate(request, req_id=None, *, idle_timeout=IDLE_TIMEOUT):
    """Async generator of events, in order, no gaps; the first event is {"kind": "submitted", "req"}."""
    req = req_id or uuid.uuid4().hex
    yield {"kind": "submitted", "req": req}
    texts = (request.prompt, *request.stop) if isinstance(request.stop, (list, tuple)) else (None,)
    if not all(protocol.encodable(text) for text in texts):  # lone surrogates pass JSON, not the engine
        yield _error("BAD_REQUEST", "The prompt or a stop string is not valid Unicode (a lone surrogate).")
        return
    boot = await liveness.aget_boot()
    if boot is None:
        yield _broker_down("no answer")
        return
    if not boot:
        yield _error("ENGINE_UNAVAILABLE", "The engine bridge is not running.", retry_after=5)
        return
    inbox = asyncio.Queue()
    # The reply list is read by a task of its own that is not cancelled while the job is live
    # (a pop cancelled mid-flight could lose a batch): callers may cancel us; the drain goes on.
    receiver = asyncio.create_task(_receive_until_final(req, inbox))
    finished = False
    try:
        try:
            await transport.to_bridge({"type": "gen.submit", "req": req, "boot": boot, "job": asdict(request)})
        except Exception as exc:  # Redis refused the submit: nothing reached the bridge
            finished = True
            receiver.cancel()
            yield _broker_down(exc)
            return
        expected, pending, queued = 0, {}, False
        loop = asyncio.get_running_loop()
        idle_deadline = loop.time() + idle_timeout
        while True:
            timeout = GAP_TIMEOUT if pending else min(LIVENESS_POLL, max(0.0, idle_deadline - loop.time()))
            try:
                message = await asyncio.wait_for(inbox.get(), timeout)
            except asyncio.TimeoutError:
                if pending:
                    yield _error("ENGINE_ERROR", f"Lost events from the engine bridge (seq {expected}).")
                    return
                now_boot = await liveness.aget_boot()
                if now_boot is not None and now_boot != boot:
                    yield _error("ENGINE_UNAVAILABLE", "The engine bridge stopped while handling this request"
                                 + (" and was restarted." if now_boot else "."), retry_after=5)
                    return
                if queued or loop.time() < idle_deadline:
                    continue  # waiting our turn, or still within the idle limit, and the bridge lives
                yield _error("ENGINE_UNAVAILABLE", "The engine did not answer in time.")
                return
            idle_deadline = loop.time() + idle_timeout
            # Everything that already arrived is handled as one: a reader that fell behind gets
            # its text merged (one delta, one SSE chunk) instead of paying per batch.
            for message in [message, *_drain(inbox)]:
                if message.get("seq", -1) >= expected:
                    pending[message["seq"]] = message
            events = []
            while expected in pending:
                events.extend(pending.pop(expected)["events"])
                expected += 1
            for event in _merge_text(events):
                queued = event["kind"] == "queued"
                if event["kind"] in FINAL_KINDS:
                    finished = True
                    yield event
                    return
                yield event
    finally:
        if not finished:
            await asyncio.shield(cancel(req))
            # The receiver keeps draining until the bridge's final event (CANCELLED), bounded.
            receiver.add_done_callback(lambda t: t.cancelled() or t.exception())
        else:
            await asyncio.shield(receiver)


def _drain(queue):
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def _merge_text(events):
    out = []
    for event in events:
        if event["kind"] == "text" and out and out[-1]["kind"] == "text":
            out[-1] = {**out[-1], "text": out[-1]["text"] + event["text"]}
        else:
            out.append(event)
    return out


async def _receive_until_final(req, inbox, *, drain_timeout=DRAIN_TIMEOUT):
    """Moves the bridge's batches for `req` into inbox until one carries a final event; gives up
    when nothing arrives (or Redis stays unreachable) for drain_timeout."""
    seen, final_seq = set(), None
    loop = asyncio.get_running_loop()
    last_progress = loop.time()
    try:
        while final_seq is None or len(seen) <= final_seq:
            try:
                messages = await transport.replies(req)
            except Exception as exc:  # Redis outage: keep trying until it is back
                log.warning("reading the replies of %s failed (%s); retrying", req, exc)
                messages = []
                await asyncio.sleep(0.2)
            if not messages:
                if loop.time() - last_progress >= drain_timeout:
                    return
                continue
            last_progress = loop.time()
            for message in messages:
                inbox.put_nowait(message)
                seen.add(message.get("seq"))
                if any(event.get("kind") in FINAL_KINDS for event in message.get("events", ())):
                    final_seq = message.get("seq")
    finally:
        if final_seq is None:  # abandoned: nobody will read what the bridge still sends
            await asyncio.shield(_forget(req))


async def _forget(req):
    try:
        await transport.forget(req)
    except Exception:
        pass


async def cancel(req_id):
    await transport.to_bridge({"type": "gen.cancel", "req": req_id})


async def stop(req_id):
    await transport.to_bridge({"type": "gen.stop", "req": req_id})
