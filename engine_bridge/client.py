"""The surface-neutral generation client (chat websocket, OpenAI API, ... all use this).

    async with contextlib.aclosing(generate(GenerationRequest(prompt=..., max_tokens=64))) as events:
        async for event in events:
            ...   # first {"kind": "submitted", "req": <id>}, then {"kind": "routed", "bridge": <id>},
                  # then the bridge's events (docs/contracts.md)

Leaving the iterator early (break + aclose, exception, task cancelled) sends gen.cancel to the
bridge that took the request.

generate reads as its three steps: what may be submitted at all and where (_admissible: the
registry snapshot and engine_bridge.routing), the submit (_submit, to that bridge's inbox), and
the listening (_Stream: a request's batches in `seq` order, the gap, liveness and idle rules,
its liveness that of the bridge it went to); engine_bridge.listener is the one reader of a web
process's reply list.
"""
import asyncio
import collections
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, replace

from engine_bridge import liveness, registry, routing, transport
from engine_bridge.listener import loop_listener
from engine_bridge.request import GenerationRequest, encodable, job_message

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0   # nothing from the bridge for this long while not queued -> ENGINE_UNAVAILABLE
GAP_TIMEOUT = 2.0      # a missing seq not filled within this long -> the stream is broken
FINAL_KINDS = ("done", "error")
LIVENESS_POLL = 1.0    # nothing arrived for this long: is the bridge that took the job still alive?
BROKER_RETRY_S = 2     # Retry-After while Redis cannot be reached
BROKER_OUTAGE_S = 10.0  # how long a surface rides out a Redis outage before it tells the user
# The served-model read a request makes first (engine_bridge.served) read the registry this long
# ago at most: the route takes that snapshot (one registry read per request, issue 26). Nothing
# it cannot show is lost: this process's own routes and ends since are counted (_unseen,
# _with_recent_holds), and another process's within that time are as unseen as between beats.
ROUTE_SNAPSHOT_S = 0.05


@dataclass(frozen=True)
class Target:
    """Where a request went: the bridge's id, the boot it was meant for, the host it runs on."""
    bridge: str
    boot: str
    host: str = ""


def _error(code: str, message: str, **extra: object) -> dict:
    return {"kind": "error", "code": code, "message": message, **extra}


def _broker_down(exc: object) -> dict:
    """Nothing reached the bridge because Redis did not answer; `broker: true` lets a surface retry
    (the chat relay does, within BROKER_OUTAGE_S). The exception's text (hosts, ports) is logged,
    never put in an event a user may read."""
    log.warning("the message broker (Redis) cannot be reached: %s", exc)
    return _error("ENGINE_UNAVAILABLE", transport.BROKER_DOWN,
                  retry_after=BROKER_RETRY_S, broker=True)


async def generate(request: GenerationRequest, req_id: str | None = None, *, boot: str | None = None,
                   idle_timeout: float = IDLE_TIMEOUT,
                   tick: Callable[[], float] | None = None) -> AsyncGenerator[dict | None, None]:
    """Async generator of events, in order, no gaps; the first event is {"kind": "submitted", "req"},
    the second (unless the request is refused before any submit) {"kind": "routed", "bridge"}.

    `boot`: read by earlier releases' callers with the served model (kept for them); the router's
    registry snapshot names the chosen bridge's boot, and only with no bridge registered does
    this one count.

    `tick` (a function returning seconds, asked after every yield): a None is yielded whenever that
    long passes without an event — a surface's keepalive or deadline check, kept here so that a
    stream pays no task per event for it.

    Invariant: unless the bridge's own final event (done / error) was yielded, leaving sends
    gen.cancel to the bridge that took it, so no engine slot keeps generating for a consumer that
    is gone."""
    req = req_id or uuid.uuid4().hex
    yield {"kind": "submitted", "req": req}
    target, refusal = await _admissible(request, boot, req)
    if target is None:
        yield refusal
        return
    try:
        yield {"kind": "routed", "bridge": target.bridge}
    except BaseException:  # closed or cancelled before the submit: it is no load anywhere
        _flights.pop(req, None)
        raise
    _routed[req] = target.bridge  # stop(req) / cancel(req) find it
    listener = loop_listener()
    inbox = listener.register(req)  # before the submit: no reply may come unheard
    finished, flight = False, _flights[req]  # _admissible recorded it with the target
    texts: list[str] = []  # the text so far: the slot holds prompt + text when the turn is done
    try:
        unsent = await _submit(req, target, listener.id, request)
        if unsent is not None:  # nothing reached the bridge: nothing to cancel
            finished = True
            yield unsent
            return
        stream = _Stream(inbox, target, idle_timeout, tick)  # its clocks start at the submit
        while True:
            for event in await stream.next_events():
                if event is not None and isinstance(event.get("admitted"), int):
                    flight.admitted = event["admitted"]
                if event is not None and event["kind"] == "text":
                    texts.append(event["text"])
                elif event is not None and event["kind"] in FINAL_KINDS:
                    finished = not stream.broken
                    _record_end(req, event, request.conversation_key, request.prompt + "".join(texts))
                    yield event
                    return
                yield event
    finally:
        _flights.pop(req, None)
        listener.unregister(req)  # what still comes for req (its CANCELLED) is dropped by the listener
        _routed.pop(req, None)
        if not finished:
            await asyncio.shield(cancel(req, target.bridge))


async def _admissible(request: GenerationRequest, boot: str | None, req: str) -> tuple[Target | None, dict]:
    """(where to submit, {}), or (None, the error that ends the stream before any submit): text
    the engine cannot take, Redis not answering, no bridge running or none serving the model."""
    texts = (request.prompt, *request.stop) if isinstance(request.stop, (list, tuple)) else (None,)
    if not all(encodable(text) for text in texts):  # lone surrogates pass JSON, not the engine
        return None, _error("BAD_REQUEST", "The prompt or a stop string is not valid Unicode (a lone surrogate).")
    try:
        bridges = _with_recent_holds(await registry.abridges_get(ROUTE_SNAPSHOT_S))
    except Exception as exc:
        return None, _broker_down(exc)
    if not bridges:  # every target has its flight, the default bridge's too (KeyError in CI)
        target, refusal = await _unregistered(boot)
        if target is not None:
            _flights[req] = _Flight(target.bridge, target.boot)
        return target, refusal
    model = registry.default_model(bridges) if request.model in (None, "default", "colibri") else request.model
    chosen = routing.route(bridges, str(model), conversation_key=request.conversation_key,
                           prompt_chain=_prompt_chain(request.prompt, bridges, str(model)), unseen=_unseen(bridges))
    if chosen is None:
        return None, _error("ENGINE_UNAVAILABLE", f"No engine serves the model {model!r} right now.", retry_after=5)
    _flights[req] = _Flight(chosen.bridge.id, chosen.bridge.boot)  # no await since the snapshot: the next route sees it
    return Target(chosen.bridge.id, chosen.bridge.boot, chosen.bridge.host), {}


# What this process knows of its requests that a bridge's last registration may not show yet.
# Each registration counts the requests its bridge has admitted and ended since its boot, and the
# bridge's events carry each request's ordinals ("admitted" on its first event, "ended" on its
# final one), so which requests a registration shows is exact, never a guess from clocks (beat
# times against event times failed in CI, stop 30: a beat that showed a turn's end often landed
# before its done event did, and a beat that predated a new stream's admission came back after
# its first text). Two corrections follow (routing.route counts them, engine_bridge.routing says
# why each matters): a request routed but not admitted by the last registration is load it does
# not show; one it shows running that has ended since is load it shows no more; and a turn that
# ended since is a slot it does not show held (the next turn, sent at once, must find it).
@dataclass
class _Flight:
    bridge: str
    boot: str
    admitted: int = 0  # the bridge's ordinal of the request's admission (0: not known yet)


@dataclass
class _End:
    bridge: str
    boot: str
    admitted: int
    ended: int         # the bridge's ordinal of its end
    at: float          # when this process saw it (ends older than any live registration go)
    conversation: str | None
    text: str          # what its slot holds now: prompt + output (a done turn), else ""
    chain: str | None = None  # text's prefix chain, computed when first needed


_flights: dict[str, _Flight] = {}  # req -> routed by this process and not ended yet
_ends: collections.deque[_End] = collections.deque(maxlen=256)


def _record_end(req: str, final: dict, conversation: str | None, text: str) -> None:
    """req's final event from its bridge. One this process made up (the bridge went silent) has
    no ordinal: that bridge's registrations are left to tell."""
    flight = _flights.pop(req, None)
    if flight is None or not isinstance(final.get("ended"), int):
        return
    admitted = final["admitted"] if isinstance(final.get("admitted"), int) else flight.admitted
    _ends.append(_End(flight.bridge, flight.boot, admitted, final["ended"], time.monotonic(), conversation,
                      text if final["kind"] == "done" else ""))


def _unseen_ends(b: registry.BridgeInfo) -> list[_End]:
    """The ends at b that b's registration has not counted."""
    return [e for e in _ends if e.bridge == b.id and e.boot == b.boot and e.ended > b.ended]


def _with_recent_holds(bridges: list[registry.BridgeInfo]) -> list[registry.BridgeInfo]:
    """The snapshot with each bridge's held slots completed by the turns that ended there since
    its registration (a short turn ends within the heart's EARLY_BEAT_GAP_S of a beat; the next
    turn, sent at once, would find neither its conversation nor its prefix: CI, stop 31).
    Another web process's turns stay unseen until the beat (that gap plus a round trip)."""
    now = time.monotonic()
    while _ends and _ends[0].at < now - liveness.STALE_S:  # older than any live registration
        _ends.popleft()
    out = []
    for b in bridges:
        late = [e for e in _unseen_ends(b) if e.text]
        for e in late:
            if e.chain is None:
                e.chain = registry.prefix_chain(e.text)
        out.append(replace(b, held=tuple(registry.SlotHeld(e.conversation, str(e.chain)) for e in late) + b.held)
                   if late else b)
    return out


def _unseen(bridges: Sequence[registry.BridgeInfo]) -> dict[str, int]:
    """bridge id -> requests to add to its registered load (negative: ones it still counts)."""
    out = {}
    for b in bridges:
        routed = sum(1 for f in _flights.values() if f.bridge == b.id and f.boot == b.boot
                     and not 0 < f.admitted <= b.admitted)
        gone = sum(1 for e in _unseen_ends(b) if 0 < e.admitted <= b.admitted)
        if routed - gone:
            out[b.id] = routed - gone
    return out


async def _unregistered(boot: str | None) -> tuple[Target | None, dict]:
    """No bridge registered: the default bridge by its heartbeat alone (one played by hand in
    tests, or of a release before the registry)."""
    if boot is None:
        boot = await liveness.aget_boot()
    if boot is None:
        return None, _broker_down("no answer")
    if not boot:
        return None, _error("ENGINE_UNAVAILABLE", "The engine bridge is not running.", retry_after=5)
    return Target(transport.bridge_id(), boot), {}


def _prompt_chain(prompt: str, bridges: list[registry.BridgeInfo], model: str) -> str:
    """The prompt's prefix chain, as far as any candidate's slot reaches; "" when one bridge (or
    none) serves the model and there is nothing to choose."""
    serving = [b for b in bridges if b.model == model]
    if len(serving) < 2:
        return ""
    reach = max((len(h.chain) for b in serving for h in b.held), default=0) // registry.DIGEST_CHARS
    return registry.prefix_chain(prompt, reach) if reach else ""


async def _submit(req: str, target: Target, reply: str, request: GenerationRequest) -> dict | None:
    """Sends gen.submit to the target's inbox; the error to end the stream with when Redis
    refused it, else None."""
    try:
        await transport.to_bridge({"type": "gen.submit", "req": req, "boot": target.boot, "reply": reply,
                                   "lease": True, "job": job_message(request)}, target.bridge)
    except Exception as exc:  # Redis refused the submit: nothing reached the bridge
        return _broker_down(exc)
    return None


class _Stream:
    """One request's side of its reply batches: waits for them, puts them in `seq` order, and
    decides when the stream is broken (a gap not filled within GAP_TIMEOUT, the bridge restarted
    or gone, nothing for idle_timeout while not queued). `broken`: the last event next_events
    returned is such a client-side error (the bridge never ended the request: cancel it)."""

    def __init__(self, inbox: asyncio.Queue, target: Target, idle_timeout: float,
                 tick: Callable[[], float] | None) -> None:
        self.inbox, self.target, self.idle_timeout, self.tick = inbox, target, idle_timeout, tick
        self.loop = asyncio.get_running_loop()
        self.pending: dict[int, dict]  # seq -> a batch that came early
        self.expected, self.pending, self.queued, self.broken = 0, {}, False, False
        self.idle_deadline = self.loop.time() + idle_timeout
        self.tick_at = self.loop.time() + tick() if tick else None
        self.resumed = ""  # what the last call returned: "events", "tick" (the caller asks on after it)

    async def next_events(self) -> Sequence[dict | None]:
        """The next events in order (None: a tick passed); a final event, if any, comes last."""
        if self.resumed == "events" and self.tick:
            self.tick_at = self.loop.time() + self.tick()
        elif self.resumed == "tick" and self.tick:
            self.tick_at = self.loop.time() + self.tick()
            failure = await self._check()
            if failure is not None:
                return [failure]
        self.resumed = ""
        while True:
            message = await self._wait()
            if message is not None:
                self.resumed = "events"
                return self._take([message, *_drain(self.inbox)])
            if self.pending:
                lost = _error("ENGINE_ERROR", f"Lost events from the engine bridge (seq {self.expected}).")
                return [self._fail(lost)]
            if self.tick_at is not None and self.loop.time() >= self.tick_at:
                self.resumed = "tick"
                return [None]
            failure = await self._check()
            if failure is not None:
                return [failure]

    async def _wait(self) -> dict | None:
        """The next message, or None once the current timeout passes without one."""
        loop = self.loop
        timeout = GAP_TIMEOUT if self.pending else min(LIVENESS_POLL, max(0.0, self.idle_deadline - loop.time()))
        if self.tick_at is not None:
            timeout = min(timeout, max(0.0, self.tick_at - loop.time()))
        try:
            if self.inbox.empty():  # asyncio.timeout, not wait_for: no task per batch
                async with asyncio.timeout(timeout):
                    return await self.inbox.get()
            return self.inbox.get_nowait()
        except TimeoutError:
            return None

    async def _check(self) -> dict | None:
        """After a quiet spell: the error that ends the stream (its bridge restarted or gone, or no
        answer in time while not queued), or None to wait on."""
        now_boot = await liveness.aget_boot(self.target.bridge)
        if now_boot == "" and await liveness.abroker_is_young():
            now_boot = None  # Redis restarted and lost the beat: the bridge writes it again
        if now_boot is not None and now_boot != self.target.boot:
            return self._fail(_error("ENGINE_UNAVAILABLE", _gone_message(self.target, restarted=bool(now_boot)),
                                     retry_after=5, bridge=self.target.bridge))
        if self.queued or self.loop.time() < self.idle_deadline:
            return None  # waiting our turn, or still within the idle limit, and the bridge lives
        return self._fail(_error("ENGINE_UNAVAILABLE", "The engine did not answer in time."))

    def _fail(self, event: dict) -> dict:
        self.broken = True
        return event

    def _take(self, messages: list[dict]) -> list[dict]:
        """Everything that already arrived, handled as one: a reader that fell behind gets its
        text merged (one delta, one SSE chunk) instead of paying per batch."""
        self.idle_deadline = self.loop.time() + self.idle_timeout
        for message in messages:
            if message.get("seq", -1) >= self.expected:
                self.pending[message["seq"]] = message
        events = []
        while self.expected in self.pending:
            events.extend(self.pending.pop(self.expected)["events"])
            self.expected += 1
        # `alive`: the bridge's engine works on this request without output yet (a long prefill);
        # it has reset the idle deadline above and is not the caller's business
        merged = _merge_text([event for event in events if event["kind"] != "alive"])
        for event in merged:
            self.queued = event["kind"] == "queued"
            if event["kind"] in FINAL_KINDS:
                return merged[:merged.index(event) + 1]
        return merged


def _gone_message(target: Target, *, restarted: bool) -> str:
    """What a stream's end says when its bridge stopped beating (killed, its host gone) or came back
    as a new boot, which knows nothing of the old one's requests."""
    where = f"bridge {target.bridge}" + (f" on {target.host}" if target.host else "")
    if restarted:
        return f"The engine bridge stopped while handling this request and was restarted ({where})."
    return f"The engine bridge stopped while handling this request: its engine host went away ({where})."


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def _merge_text(events: list[dict]) -> list[dict]:
    out: list[dict] = []
    for event in events:
        if event["kind"] in ("text", "reasoning") and out and out[-1]["kind"] == event["kind"]:
            merged = {**out[-1], "text": out[-1]["text"] + event["text"]}
            if "logprobs" in event or "logprobs" in merged:
                merged["logprobs"] = [*out[-1].get("logprobs", ()), *event.get("logprobs", ())]
            out[-1] = merged
        else:
            out.append(event)
    return out


_routed: dict[str, str] = {}  # req -> the bridge it went to, while its generate() runs in this process


async def cancel(req_id: str, bridge: str | None = None) -> None:
    """gen.cancel to `bridge` (None: the bridge this process routed req_id to, else this
    process's bridge id)."""
    await transport.to_bridge({"type": "gen.cancel", "req": req_id}, bridge or _routed.get(req_id))


async def stop(req_id: str, bridge: str | None = None) -> None:
    """gen.stop to `bridge` (None: the bridge this process routed req_id to, else this process's
    bridge id)."""
    await transport.to_bridge({"type": "gen.stop", "req": req_id}, bridge or _routed.get(req_id))
