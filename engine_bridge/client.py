"""The surface-neutral generation client (chat websocket, OpenAI API, ... all use this).

    async with contextlib.aclosing(generate(GenerationRequest(prompt=..., max_tokens=64))) as events:
        async for event in events:
            ...   # first {"kind": "submitted", "req": <id>}, then the bridge's events (docs/contracts.md)

Leaving the iterator early (break + aclose, exception, task cancelled) sends gen.cancel.
"""
import asyncio
import base64
import logging
import uuid
import weakref
from dataclasses import asdict, dataclass, field

from engine_bridge import liveness, protocol, transport

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0   # nothing from the bridge for this long while not queued -> ENGINE_UNAVAILABLE
GAP_TIMEOUT = 2.0      # a missing seq not filled within this long -> the stream is broken
FINAL_KINDS = ("done", "error")
LIVENESS_POLL = 1.0    # nothing arrived for this long: is the bridge that took the job still alive?
BROKER_RETRY_S = 2     # Retry-After while Redis cannot be reached
BROKER_OUTAGE_S = 10.0  # how long a surface rides out a Redis outage before it tells the user


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
    top_k: int | None = None         # sample among the k most likely tokens (our engine's top_k=); None: no cut
    logprobs: int = 0                # k > 0: each text event carries its tokens' logprobs and k candidates
    grammar: bytes | None = None     # CGD1 DFA (engine_bridge.grammar) the output must stay in; only
                                     # for an engine that announces it (MODEL "grammar"), else refused


def job_message(request):
    """The job as JSON-able data: the grammar's bytes travel as base64 (worker.parse_job decodes)."""
    job = asdict(request)
    if job.get("grammar") is not None:
        job["grammar"] = base64.b64encode(bytes(job["grammar"])).decode("ascii")
    return job


def _error(code, message, **extra):
    return {"kind": "error", "code": code, "message": message, **extra}


def _broker_down(exc):
    """Nothing reached the bridge because Redis did not answer; `broker: true` lets a surface retry
    (the chat relay does, within BROKER_OUTAGE_S). The exception's text (hosts, ports) is logged,
    never put in an event a user may read."""
    log.warning("the message broker (Redis) cannot be reached: %s", exc)
    return _error("ENGINE_UNAVAILABLE", "The message broker (Redis) cannot be reached.",
                  retry_after=BROKER_RETRY_S, broker=True)


async def generate(request, req_id=None, *, boot=None, idle_timeout=IDLE_TIMEOUT, tick=None):
    """Async generator of events, in order, no gaps; the first event is {"kind": "submitted", "req"}.

    `boot`: the running bridge's boot id as the caller just read it (liveness.aget_boot's answer,
    e.g. with the served model's facts); None: read it here.

    `tick` (a function returning seconds, asked after every yield): a None is yielded whenever that
    long passes without an event — a surface's keepalive or deadline check, kept here so that a
    stream pays no task per event for it."""
    req = req_id or uuid.uuid4().hex
    yield {"kind": "submitted", "req": req}
    texts = (request.prompt, *request.stop) if isinstance(request.stop, (list, tuple)) else (None,)
    if not all(protocol.encodable(text) for text in texts):  # lone surrogates pass JSON, not the engine
        yield _error("BAD_REQUEST", "The prompt or a stop string is not valid Unicode (a lone surrogate).")
        return
    if boot is None:
        boot = await liveness.aget_boot()
    if boot is None:
        yield _broker_down("no answer")
        return
    if not boot:
        yield _error("ENGINE_UNAVAILABLE", "The engine bridge is not running.", retry_after=5)
        return
    listener = _listener()
    inbox = listener.register(req)
    finished = False
    try:
        try:
            await transport.to_bridge({"type": "gen.submit", "req": req, "boot": boot, "reply": listener.id,
                                       "lease": True, "job": job_message(request)})
        except Exception as exc:  # Redis refused the submit: nothing reached the bridge
            finished = True
            yield _broker_down(exc)
            return
        expected, pending, queued = 0, {}, False
        loop = asyncio.get_running_loop()
        idle_deadline = loop.time() + idle_timeout
        tick_at = loop.time() + tick() if tick else None
        while True:
            timeout = GAP_TIMEOUT if pending else min(LIVENESS_POLL, max(0.0, idle_deadline - loop.time()))
            if tick_at is not None:
                timeout = min(timeout, max(0.0, tick_at - loop.time()))
            try:
                if inbox.empty():  # asyncio.timeout, not wait_for: no task per batch
                    async with asyncio.timeout(timeout):
                        message = await inbox.get()
                else:
                    message = inbox.get_nowait()
            except TimeoutError:
                if pending:
                    yield _error("ENGINE_ERROR", f"Lost events from the engine bridge (seq {expected}).")
                    return
                if tick_at is not None and loop.time() >= tick_at:
                    yield None
                    tick_at = loop.time() + tick()
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
            if tick:
                tick_at = loop.time() + tick()
    finally:
        listener.unregister(req)  # what still comes for req (its CANCELLED) is dropped by the listener
        if not finished:
            await asyncio.shield(cancel(req))


def _drain(queue):
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def _merge_text(events):
    out = []
    for event in events:
        if event["kind"] == "text" and out and out[-1]["kind"] == "text":
            merged = {**out[-1], "text": out[-1]["text"] + event["text"]}
            if "logprobs" in event or "logprobs" in merged:
                merged["logprobs"] = [*out[-1].get("logprobs", ()), *event.get("logprobs", ())]
            out[-1] = merged
        else:
            out.append(event)
    return out


class Listener:
    """One event loop's reader of its reply list (engine_bridge.transport): moves each batch to
    the queue of the request it belongs to, so N streams of a web process cost one blocking pop
    per round trip, not N. Callers never cancel it (a pop cancelled mid-flight could lose batches
    of every request of the loop); it ends by itself once the loop has no request registered.

    It also holds the loop's lease (transport.lease_key), renewed every LEASE_BEAT_S while any
    request is registered: when the process dies (kill -9, OOM, a host gone) the lease expires
    and the bridge cancels its requests, so no engine slot keeps generating for nobody (issue 24).
    A Redis outage only delays renewals; the bridge does not judge leases across one."""

    def __init__(self):
        self.id = uuid.uuid4().hex
        self.queues = {}   # req -> asyncio.Queue of its batches
        self.task = None
        self.lease_task = None

    def register(self, req):
        queue = self.queues[req] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._run())
        if self.lease_task is None or self.lease_task.done():
            self.lease_task = loop.create_task(self._lease())
        return queue

    async def _lease(self):
        failing = False
        while self.queues:
            try:
                await transport.lease_renew(self.id)
                failing = False
            except Exception as exc:  # Redis outage: renew again next beat
                if not failing:
                    log.warning("renewing the lease of %s failed (%s); retrying", self.id, exc)
                failing = True
            await asyncio.sleep(transport.LEASE_BEAT_S)

    def unregister(self, req):
        self.queues.pop(req, None)

    async def _run(self):
        while self.queues:
            try:
                messages = await transport.replies(self.id)
            except Exception as exc:  # Redis outage: keep trying while anyone waits
                log.warning("reading reply list %s failed (%s); retrying", self.id, exc)
                await asyncio.sleep(0.2)
                continue
            for message in messages:
                queue = self.queues.get(message.get("req"))
                if queue is not None:
                    queue.put_nowait(message)


_listeners = weakref.WeakKeyDictionary()


def _listener():
    loop = asyncio.get_running_loop()
    if loop not in _listeners:
        _listeners[loop] = Listener()
    return _listeners[loop]


async def cancel(req_id):
    await transport.to_bridge({"type": "gen.cancel", "req": req_id})


async def stop(req_id):
    await transport.to_bridge({"type": "gen.stop", "req": req_id})
