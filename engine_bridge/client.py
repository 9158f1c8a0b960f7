"""The surface-neutral generation client (chat websocket, OpenAI API, ... all use this).

    async with contextlib.aclosing(generate(GenerationRequest(prompt=..., max_tokens=64))) as events:
        async for event in events:
            ...   # first {"kind": "submitted", "req": <id>}, then the bridge's events (docs/contracts.md)

Leaving the iterator early (break + aclose, exception, task cancelled) sends gen.cancel.
"""
import asyncio
import uuid
from dataclasses import asdict, dataclass, field

from channels.layers import get_channel_layer

from engine_bridge import telemetry

BRIDGE_CHANNEL = "engine-bridge"
IDLE_TIMEOUT = 120.0   # nothing from the bridge for this long while not queued -> ENGINE_UNAVAILABLE
GAP_TIMEOUT = 2.0      # a missing seq not filled within this long -> the stream is broken
DRAIN_TIMEOUT = IDLE_TIMEOUT + 30.0  # receiver gives up after this long without a batch
FINAL_KINDS = ("done", "error")


@dataclass
class GenerationRequest:
    prompt: str                      # fully rendered prompt (the caller renders the chat template)
    max_tokens: int
    temperature: float = 0.0         # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None          # sent as seed=<n> to engines with our extensions (MODEL line)
    stop: list[str] = field(default_factory=list)
    conversation_key: str | None = None
    priority: str = "interactive"    # or "background"
    topk: bool = False


def _error(code, message):
    return {"kind": "error", "code": code, "message": message}


async def generate(request, req_id=None, *, idle_timeout=IDLE_TIMEOUT):
    """Async generator of events, in order, no gaps; the first event is {"kind": "submitted", "req"}."""
    layer = get_channel_layer()
    req = req_id or uuid.uuid4().hex
    yield {"kind": "submitted", "req": req}
    state = await telemetry.aget_state()
    if state["updated"] is None:
        yield _error("ENGINE_UNAVAILABLE", "The engine bridge is not running.")
        return
    # A plain (not process-local) channel of its own: channels-redis serves process-local
    # channels through one shared receive loop per process, which a consumer's cancelled receive
    # (a closing websocket) can disturb; a plain channel is a BZPOPMIN on its own key.
    reply = f"gen-reply.{req}"
    inbox = asyncio.Queue()
    # The channel-layer receive runs in its own task and is never cancelled while the job is
    # live: channels-redis can lose a message of *another* local channel (another conversation's
    # delta) when a receive is cancelled mid-pop. Callers may cancel us; the drain goes on.
    receiver = asyncio.create_task(_receive_until_final(layer, reply, req, inbox))
    finished = False
    try:
        await layer.send(BRIDGE_CHANNEL, {"type": "gen.submit", "req": req, "reply": reply,
                                          "job": asdict(request)})
        expected, pending, queued = 0, {}, False
        while True:
            timeout = GAP_TIMEOUT if pending else idle_timeout
            try:
                message = await asyncio.wait_for(inbox.get(), timeout)
            except asyncio.TimeoutError:
                if pending:
                    yield _error("ENGINE_ERROR", f"Lost events from the engine bridge (seq {expected}).")
                    return
                if queued and (await telemetry.aget_state())["updated"] is not None:
                    continue  # waiting our turn and the bridge is alive
                yield _error("ENGINE_UNAVAILABLE", "The engine did not answer in time.")
                return
            if message.get("seq", -1) < expected:
                continue
            pending[message["seq"]] = message
            while expected in pending:
                for event in pending.pop(expected)["events"]:
                    queued = event["kind"] == "queued"
                    if event["kind"] in FINAL_KINDS:
                        finished = True
                        yield event
                        return
                    yield event
                expected += 1
    finally:
        if not finished:
            await asyncio.shield(cancel(req))
            # The receiver keeps draining until the bridge's final event (CANCELLED), bounded.
            receiver.add_done_callback(lambda t: t.cancelled() or t.exception())
        else:
            await asyncio.shield(receiver)


async def _receive_until_final(layer, channel, req, inbox, *, drain_timeout=DRAIN_TIMEOUT):
    """Moves the bridge's batches for `req` into inbox until one carries a final event. Gives up
    (one last, unavoidable cancelled receive) only when nothing arrives for drain_timeout."""
    seen, final_seq = set(), None
    while final_seq is None or len(seen) <= final_seq:
        try:
            message = await asyncio.wait_for(layer.receive(channel), drain_timeout)
        except asyncio.TimeoutError:
            return
        if message.get("req") != req:
            continue
        inbox.put_nowait(message)
        seen.add(message.get("seq"))
        if any(event.get("kind") in FINAL_KINDS for event in message.get("events", ())):
            final_seq = message.get("seq")


async def cancel(req_id):
    await get_channel_layer().send(BRIDGE_CHANNEL, {"type": "gen.cancel", "req": req_id})


async def stop(req_id):
    await get_channel_layer().send(BRIDGE_CHANNEL, {"type": "gen.stop", "req": req_id})
