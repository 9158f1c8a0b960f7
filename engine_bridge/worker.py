"""The bridge worker: the only owner of the engine. Takes gen.submit / gen.cancel / gen.stop from
its inbox and relays each request's events to the request's reply list in numbered batches
(engine_bridge.transport, docs/contracts.md).

Why batches, and when: each request has at most one batch on its way to Redis. An event that
finds none in flight leaves at once (the first token never waits), except text that follows a
text batch of the same request sent less than its text interval ago; events arriving meanwhile
coalesce (text merged) and leave together. The text interval is a frame (BRIDGE_TEXT_FRAME_S)
for one stream and grows with the number of streams so that all of them together send at most
settings.BRIDGE_TEXT_BATCHES_PER_S text batches a second; held text of concurrent streams leaves
together (on_tick), so they share one send and one web-process wakeup per interval. A batch
costs the web path about half a millisecond of CPU (bridge, Redis, Daphne, bench/webpath.py), and
on a small host every such millisecond, and every wakeup that preempts an engine thread, comes out
of the engine's own throughput. For the same reason an engine that writes a token at a time is read at most every
READ_PAUSE_S while every running request already has its first text (read_pause). Batches are
numbered; the client fails loudly on a gap.

Failure containment: a Redis outage never ends the worker (receives and sends retry with a
backoff; the engine and its slots live on); a request that arrives while the engine is not up is
answered ENGINE_UNAVAILABLE at once with a `retry_after` hint, never parked behind a restart that
may not come; a heartbeat (engine_bridge.liveness) lets waiting clients notice a dead bridge.
"""
import asyncio
import base64
import binascii
import codecs
import logging
import re
import time
from dataclasses import dataclass, field

from django.conf import settings

from engine_bridge import protocol as p
from engine_bridge import sampling
from engine_bridge.liveness import Heart
from engine_bridge import transport
from engine_bridge.client import GenerationRequest
from engine_bridge.engine import EngineFailed, Supervisor, next_id
from engine_bridge.scheduler import Job, QueueFull, Scheduler
from engine_bridge.stops import MAX_STOP_CHARS, MAX_STOPS, StopMatcher
from engine_bridge.telemetry import Publisher

log = logging.getLogger(__name__)

DIED_MESSAGE = "The engine stopped unexpectedly while generating; it is restarting."
UNAVAILABLE_MESSAGE = "The engine is not running right now (it is {status}); retry in {retry_after} s."
REDIS_RETRY_FIRST, REDIS_RETRY_MAX = 0.1, 2.0
READ_PAUSE_S = 0.02  # longest wait between reads of a slow (token-at-a-time) engine output
SLOW_TOKEN_S = 0.001  # seconds per token and request from which an engine counts as token-at-a-time
QUEUE_FULL_RETRY_S = 2  # what a refused client is told to wait: about one short turn
SEND_GIVE_UP_S = 30.0  # a reply batch not delivered within this long of an outage is dropped
JOB_FIELDS = set(GenerationRequest.__dataclass_fields__)
REPLY_NAME = re.compile(r"[0-9A-Za-z_-]{1,64}")  # a client's reply list name (part of a Redis key)
# Job fields that travel as key=value extensions (our engine only), with the value that sends none.
EXTENSION_DEFAULTS = {"seed": None, "experts": None, "routes": False, "heat": True, "top_k": None, "logprobs": 0}
GRAMMAR_FORMAT = "CGD1"  # the grammar wire format our engine announces (MODEL "grammar")
GRAMMAR_REFUSAL = ("constrained decoding is not supported by this engine (structured output needs an engine "
                   "that announces the CGD1 grammar extension)")
WATCH_S = 0.5        # how often the bridge looks at its engine (watch_engine)
PING_AFTER_S = 2.0   # an engine silent this long is asked something it must answer
HUNG_AFTER_S = 10.0  # that question unanswered this long (no output at all): the engine is hung
LEASE_CHECK_S = 0.5  # how often the bridge checks the leases of the requesters it serves
LEASE_GRACE_S = 1.5  # a lease missing this long after it was last seen (or Redis came back): gone


@dataclass
class Request:
    req: str
    job: GenerationRequest
    reply_to: str = ""       # the client's reply list (transport.reply_key); its own req if none named
    leased: bool = False     # its requester holds a lease (transport.lease_key) the bridge checks
    t_submit: float = field(default_factory=time.monotonic)
    eng_id: int | None = None
    slot: int | None = None
    decoder: object = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    text: str = ""           # decoded output so far
    tokens: int = 0          # DATA lines so far (one per token)
    sent: int = 0            # chars of text already emitted
    stopped: bool = False    # a stop string matched (STOP sent): drop further DATA
    matcher: StopMatcher | None = None  # the job's stop strings' automaton (built at the first text)
    stop_sequence: str | None = None  # the client's stop string that matched
    cancelled: bool = False  # CANCEL sent: drop further DATA, wait for CANCELLED or DONE
    t_first: float | None = None
    t_first_wall: float | None = None  # unix time of the first text: where latency is measured from
    prompt_tokens: int | None = None
    reused: int | None = None
    topk: list = field(default_factory=list)
    lp_pending: list = field(default_factory=list)  # logprob entries of tokens whose text is not sent yet
    perf: dict | None = None
    routing: dict | None = None  # the engine's ROUTES for this turn (routes=True)
    io: dict | None = None       # the engine's IOSTAT for this turn, as IoStat.figures()
    outbox: list = field(default_factory=list)
    seq: int = 0
    sending: bool = False    # a batch of this request is on its way to Redis
    text_sent_at: float | None = None  # when a batch with text last left (the frame-rate floor)
    position: int | None = None


def parse_job(raw, model_info=None):
    job = GenerationRequest(**{k: v for k, v in (raw or {}).items() if k in JOB_FIELDS})
    if not isinstance(job.prompt, str) or not job.prompt:
        raise p.SubmitError("prompt must be a non-empty string")
    if not isinstance(job.stop, list) or not all(isinstance(s, str) and s for s in job.stop):
        raise p.SubmitError("stop must be a list of non-empty strings")
    if len(job.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in job.stop):
        raise p.SubmitError(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    if not all(p.encodable(s) for s in (job.prompt, *job.stop)):
        raise p.SubmitError("prompt and stop must be valid UTF-8 (no lone surrogates)")
    # The wire form of every number, decided by the one owner of the rules: a value the engine
    # would refuse in the header must never reach it (that refusal is a stream-level ERROR 0).
    try:
        job.temperature, job.top_p, job.seed = sampling.sampling_validate(
            temperature=job.temperature, top_p=job.top_p, seed=job.seed,
            defaults=sampling.model_defaults(model_info))
    except sampling.SamplingError as exc:
        raise p.SubmitError(exc.message) from None
    if job.experts is not None and (isinstance(job.experts, bool) or not isinstance(job.experts, int)):
        raise p.SubmitError("experts must be an integer")
    for name in ("routes", "heat", "topk"):
        if not isinstance(getattr(job, name), bool):
            raise p.SubmitError(f"{name} must be true or false")
    if job.grammar is not None:
        try:
            job.grammar = base64.b64decode(job.grammar, validate=True) if isinstance(job.grammar, str) else None
        except (binascii.Error, ValueError):
            job.grammar = None
        if not job.grammar:
            raise p.SubmitError("grammar must be non-empty base64 (engine_bridge.client.job_message)")
    p.format_submit(1, 0, job.prompt, job.max_tokens, job.temperature, job.top_p, slots=1, top_k=job.top_k,
                    logprobs=job.logprobs, grammar=job.grammar)
    return job


def started_facts():
    """What the bridge knows of the model of an engine that does not describe itself."""
    from pathlib import Path

    snap = Path(str(settings.ENGINE_MODEL))  # a GGUF file, or a model folder (colibri's SNAP)
    name = snap.name.removesuffix(".gguf")
    return {"name": name, "file": str(snap), "ctx": settings.ENGINE_CTX,
            "slots": settings.KV_SLOTS, "extensions": False}


def extension_refusal(job, model_info):
    """Why the running engine cannot honour this job's extension fields, or None. An engine
    without a MODEL line (the real colibri binary) takes no key=value fields: refused, never
    silently dropped. The expert count is checked against the range the MODEL line announced."""
    if job.grammar is not None and (model_info or {}).get("grammar") != GRAMMAR_FORMAT:
        return GRAMMAR_REFUSAL
    if model_info is None:
        for name, default in EXTENSION_DEFAULTS.items():
            if getattr(job, name) != default:
                return f"{name} is not supported by this engine"
        return None
    if job.experts is not None:
        low, high = model_info.get("experts_min") or 0, model_info.get("experts_max") or 0
        if not high:
            return "experts: this model has no routed experts to choose"
        if not low <= job.experts <= high:
            return f"experts must be in [{low}, {high}] for this model"
    return None


def token_text(raw):
    """A token's bytes as the text OpenAI's logprobs name it: the UTF-8 text, or `bytes:\\xNN…`
    for a piece that is not valid UTF-8 on its own (half a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def logprob_entry(ev):
    """A DATA event's logprobs tail (lptext=1) -> {token, logprob, bytes, top: [{token, logprob, bytes}]}."""
    raw = ev.token_bytes or b""
    top = [{"token": token_text(b), "logprob": lp, "bytes": list(b)}
           for (tid, lp), b in zip(ev.top or [], ev.top_bytes or []) if tid >= 0]
    return {"token": token_text(raw), "logprob": ev.logprob, "bytes": list(raw), "top": top}


class Bridge:
    def __init__(self, command=None, ready_timeout=None):
        self.requests = {}   # req -> Request (queued or running)
        self.by_id = {}      # engine id -> Request
        self.block = {}      # telemetry lines since the last DONE (the block belongs to the next DONE)
        self.scheduler = Scheduler(settings.KV_SLOTS, settings.BRIDGE_QUEUE_LIMIT)
        self.scheduler.paused = True
        self.supervisor = Supervisor(self, command, ready_timeout)
        self.publisher = Publisher()
        self.publisher.update(slots=settings.KV_SLOTS)
        self.heart = Heart()
        self.deliveries = set()  # tasks sending reply batches
        self.outlets = {}        # reply list -> [(request, batch)] waiting for its sender
        self.handlers = {}       # event type -> its ev_* method
        self.senders = {}        # reply list -> the task sending to it
        self.held = {}           # req -> (request, due time) of text held back until a tick
        self.tick = None         # the timer that sends held text (its when(): the earliest due time)
        self.text_batches_per_s = settings.BRIDGE_TEXT_BATCHES_PER_S
        self.text_frame_s = settings.BRIDGE_TEXT_FRAME_S
        self.lease_seen = {}     # reply list -> when its lease was last seen (or assumed) alive

    # --- main loop ---------------------------------------------------------------------------

    async def run(self):
        tasks = [asyncio.create_task(self.supervisor.run()), asyncio.create_task(self.publisher.run()),
                 asyncio.create_task(self.heart.run()), asyncio.create_task(self.watch_engine()),
                 asyncio.create_task(self.watch_leases())]
        try:
            while True:
                for message in await self._receive():
                    try:
                        self.handle(message)
                    except Exception:
                        log.exception("bad bridge message %r", message.get("type"))
        finally:
            await self.shutdown(tasks)

    async def watch_engine(self):
        """Keeps telemetry `hung` true while the running engine is stopped (SIGSTOP: /proc says
        so, seen within WATCH_S) or does not answer: an engine silent for PING_AFTER_S gets a STOP
        of an id no request uses, which any live engine answers at once (ERROR <id> NOT_FOUND,
        ignored by ev_error); no output at all HUNG_AFTER_S after it means hung. /health reports
        it (issue 24); the engine is not restarted for it, and `hung` clears once it answers."""
        ping_at = None
        while True:
            await asyncio.sleep(WATCH_S)
            engine, hung, now = self.supervisor.engine, False, time.monotonic()
            if engine is None:
                ping_at = None
            else:
                if ping_at is not None and engine.last_output > ping_at:
                    ping_at = None  # it spoke since the question
                if engine.stopped():
                    hung = True
                elif ping_at is None and now - engine.last_output > PING_AFTER_S:
                    ping_at = now
                    self._write(engine.stop(next_id()))
                elif ping_at is not None and now - ping_at > HUNG_AFTER_S:
                    hung = True
            if hung != self.publisher.state.get("hung", False):
                (log.error if hung else log.warning)("engine %s", "stopped or not answering" if hung else "answers again")
                self.publisher.update(hung=hung)

    async def watch_leases(self):
        """Cancels every request whose requester is gone (issue 24): a web process killed under
        its streams renews no lease (transport.lease_key), and without this the engine generated
        on to max_tokens for nobody. A lease counts as gone once it was missing for LEASE_GRACE_S
        in checks that reached Redis; a check that fails, or the first after an outage (a
        restarted Redis has lost every lease), only restarts the clock, so an outage cancels
        nothing. Requests without a lease (older clients, tests' raw submits) are left alone."""
        failing, last_ok = False, time.monotonic()
        while True:
            await asyncio.sleep(LEASE_CHECK_S)
            listeners = sorted({r.reply_to for r in self.requests.values() if r.leased})
            for gone in set(self.lease_seen) - set(listeners):
                del self.lease_seen[gone]
            if not listeners:
                last_ok = time.monotonic()
                continue
            try:
                alive = await transport.leases_alive(listeners)
            except Exception as exc:
                if not failing:
                    log.warning("checking requester leases failed (%s); retrying", exc)
                failing = True
                continue
            now = time.monotonic()
            # A check that took long, or came long after the last one, spanned an outage (a frozen
            # Redis expires every lease the moment it resumes): the requesters get a grace again.
            outage, failing, last_ok = failing or now - last_ok > LEASE_GRACE_S, False, now
            for listener, ok in zip(listeners, alive):
                seen = self.lease_seen.setdefault(listener, now)
                if ok or outage:
                    self.lease_seen[listener] = now
                elif now - seen > LEASE_GRACE_S:
                    self.requester_gone(listener)

    def requester_gone(self, listener):
        """Cancels the requests of a requester whose lease expired: queued ones leave the queue,
        running ones get CANCEL (their slots free once the engine acknowledges)."""
        gone = [r for r in self.requests.values() if r.leased and r.reply_to == listener]
        log.warning("requester %s is gone (lease expired): cancelling its %d requests", listener, len(gone))
        self.lease_seen.pop(listener, None)
        for r in gone:
            self.cancel(r)

    async def _receive(self):
        """The next messages of the bridge's inbox (a burst at once), riding out a Redis outage."""
        delay = REDIS_RETRY_FIRST
        while True:
            try:
                messages = await transport.bridge_next()
                if messages:
                    return messages
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                log.error("reading the bridge inbox failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REDIS_RETRY_MAX)

    async def shutdown(self, tasks):
        self.scheduler.paused = True
        await self.supervisor.shutdown()
        for r in list(self.requests.values()):
            self.finish(r, {"kind": "error", "code": "ENGINE_UNAVAILABLE",
                            "message": "The engine bridge is shutting down."})
        deadline = time.monotonic() + SEND_GIVE_UP_S
        while self.deliveries and time.monotonic() < deadline:  # a delivery may chain the next batch
            await asyncio.wait(set(self.deliveries), timeout=max(0.0, deadline - time.monotonic()))
        if self.deliveries:
            log.error("shutting down with %d reply batches undelivered", len(self.deliveries))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.publisher.close()
        await self.heart.close()

    def post(self, r, message):
        """Queues one batch of r for its reply list; one sender per list sends everything queued
        for it in one command, so streams of one web process share round trips."""
        outlet = self.outlets.setdefault(r.reply_to, [])
        outlet.append((r, message))
        if len(outlet) == 1 and r.reply_to not in self.senders:
            task = asyncio.get_running_loop().create_task(self._deliver(r.reply_to))
            self.senders[r.reply_to] = task
            self.deliveries.add(task)
            task.add_done_callback(self.deliveries.discard)

    async def _deliver(self, listener):
        """Sends what is queued for a reply list until nothing is; each request then sends the
        events that coalesced while its batch was on the way (flush)."""
        try:
            while self.outlets.get(listener):
                batch = self.outlets.pop(listener)
                try:
                    await self._send(listener, [message for _, message in batch])
                finally:
                    for r, _ in batch:
                        r.sending = False
                        self.flush(r)
        finally:
            self.senders.pop(listener, None)

    async def _send(self, listener, messages):
        """Batches, retried while Redis is out (later events coalesce behind them)."""
        delay, give_up = REDIS_RETRY_FIRST, time.monotonic() + SEND_GIVE_UP_S
        while True:
            try:
                return await transport.reply(listener, messages)
            except Exception as exc:
                if time.monotonic() >= give_up:
                    log.error("sending %d batches to %s failed for %gs (%s); lost", len(messages), listener,
                              SEND_GIVE_UP_S, exc)
                    return
                log.warning("sending to %s failed (%s); retrying in %.1fs", listener, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, REDIS_RETRY_MAX)

    def handle(self, message):
        kind, req = message.get("type"), message.get("req")
        if kind == "gen.submit":
            self.submit(req, message.get("boot"), message.get("job"), message.get("reply"),
                        leased=message.get("lease") is True)
        elif kind == "gen.cancel" and req in self.requests:
            self.cancel(self.requests[req])
        elif kind == "gen.stop" and req in self.requests:
            self.stop(self.requests[req])

    # --- requests ----------------------------------------------------------------------------

    def submit(self, req, boot, raw_job, reply_to=None, leased=False):
        if not req or not isinstance(req, str) or req in self.requests:
            log.error("ignoring gen.submit with req=%r", req)
            return
        if not (isinstance(reply_to, str) and REPLY_NAME.fullmatch(reply_to)):
            reply_to = req
        if boot != self.heart.boot:  # meant for a bridge before this one: its client was told so
            log.warning("ignoring gen.submit %s addressed to bridge boot %r", req, boot)
            return
        engine = self.supervisor.engine
        try:
            job = parse_job(raw_job, engine.model_info if engine else None)
        except (TypeError, ValueError) as exc:
            r = Request(req, None, reply_to)
            self.finish(r, {"kind": "error", "code": "BAD_REQUEST", "message": str(exc)})
            return
        r = Request(req, job, reply_to, leased=leased and reply_to != req)
        if engine is None:
            self.finish(r, self._unavailable())
            return
        refusal = extension_refusal(job, self.supervisor.engine.model_info)
        if refusal:
            self.finish(r, {"kind": "error", "code": "BAD_REQUEST", "message": refusal})
            return
        self.requests[req] = r
        try:
            started = self.scheduler.submit(Job(req, job.prompt, job.conversation_key, job.priority))
        except QueueFull:
            self.finish(r, {"kind": "error", "code": "QUEUE_FULL", "retry_after": QUEUE_FULL_RETRY_S,
                            "message": "Too many requests are waiting; try again shortly."})
            return
        self.start_all(started)

    def _unavailable(self):
        status, retry_after = self.supervisor.status, self.supervisor.retry_after()
        return {"kind": "error", "code": "ENGINE_UNAVAILABLE", "retry_after": retry_after,
                "message": UNAVAILABLE_MESSAGE.format(status=status, retry_after=retry_after)}

    def start_all(self, started):
        for job, slot in started:
            self.start(self.requests[job.req], slot)
        for req, position in self.scheduler.positions().items():
            r = self.requests.get(req)
            if r and r.position != position:
                r.position = position
                self.emit(r, {"kind": "queued", "position": position})
        self.publisher.update(queue=len(self.scheduler.queue),
                              busy=sum(1 for s in self.scheduler.slots if s.busy is not None))

    def start(self, r, slot):
        r.eng_id, r.slot, r.position = next_id(), slot, None
        self.by_id[r.eng_id] = r
        self._write(self.supervisor.engine.submit(r.eng_id, slot, r.job))

    def _write(self, coro):
        async def run():
            try:
                await coro
            except EngineFailed as exc:  # the engine is going down; on_down fails the requests
                log.warning("engine write failed: %s", exc)
        asyncio.create_task(run())

    def cancel(self, r):
        if r.eng_id is None:
            self.scheduler.remove(r.req)
            self.finish(r, {"kind": "error", "code": "CANCELLED", "message": "Cancelled."})
            self.start_all([])
        elif not r.cancelled:
            r.cancelled = True
            self._write(self.supervisor.engine.cancel(r.eng_id))

    def stop(self, r):
        if r.eng_id is None:
            self.cancel(r)
        elif not (r.cancelled or r.stopped):
            r.stopped = True
            self._write(self.supervisor.engine.stop(r.eng_id))

    # --- events out ---------------------------------------------------------------------------

    def emit(self, r, event):
        if event["kind"] == "text":
            if not event["text"]:
                return
            if r.lp_pending:  # the logprobs of the tokens this text completes travel with it
                event["logprobs"], r.lp_pending = r.lp_pending, []
            if r.t_first is None:
                r.t_first, r.t_first_wall = time.monotonic(), time.time()
            if r.outbox and r.outbox[-1]["kind"] == "text":
                r.outbox[-1]["text"] += event["text"]
                if "logprobs" in event:
                    r.outbox[-1].setdefault("logprobs", []).extend(event["logprobs"])
                return  # merged into a batch that waits for the one in flight
        r.outbox.append(event)
        self.flush(r)

    def flush(self, r, ride=False):
        """Starts sending r's waiting events unless a batch of r is already in flight, or unless
        they are only text and a batch with text left less than text_interval() ago: the first
        token and every non-text event leave at once; later text leaves at most once a frame
        (ride: the tick of another stream takes it along, see on_tick)."""
        if r.sending or not r.outbox:
            return
        self.held.pop(r.req, None)
        only_text = all(e["kind"] == "text" for e in r.outbox)
        if only_text and r.text_sent_at is not None and not ride:
            due = r.text_sent_at + self.text_interval()
            if due > time.monotonic():
                self.hold(r, due)
                return
        if any(e["kind"] == "text" for e in r.outbox):
            r.text_sent_at = time.monotonic()
        message = {"type": "gen.events", "req": r.req, "seq": r.seq, "events": r.outbox}
        r.seq, r.outbox, r.sending = r.seq + 1, [], True
        self.post(r, message)

    def text_interval(self):
        """Seconds between two text batches of one request: a screen frame, or the share of the
        batch budget that each running request gets."""
        return max(self.text_frame_s, len(self.by_id) / self.text_batches_per_s)

    def hold(self, r, due):
        """Holds r's text until `due`; one timer for all held streams, at the earliest due time."""
        self.held[r.req] = (r, due)
        self.arm_tick(due)

    def arm_tick(self, due):
        if self.tick is None or due < self.tick.when():
            if self.tick is not None:
                self.tick.cancel()
            self.tick = asyncio.get_running_loop().call_at(due, self.on_tick)

    def on_tick(self):
        """Sends the held text that is due, and what would be due within half an interval: the
        streams fall into one phase and leave together (one send per reply list, one wakeup of
        Redis and of each web process per tick, however many streams run), none more than half
        an interval early."""
        self.tick = None
        horizon = time.monotonic() + self.text_interval() / 2
        for r, _ in [held for held in self.held.values() if held[1] <= horizon]:
            del self.held[r.req]
            self.flush(r, ride=True)
        if self.held:
            self.arm_tick(min(due for _, due in self.held.values()))

    def read_pause(self, events, cycle):
        """How long the engine reader may wait before its next read, given the events of its last
        read cycle (`cycle` seconds from the read before). When the engine writes a token at a
        time (SLOW_TOKEN_S or more per token and running request) and every running request
        already has its first text, the next read can wait READ_PAUSE_S: the pipe holds what the
        engine writes meanwhile, and a wakeup per token preempts an engine thread on a small
        host. The rate counts the cycle, pause included, so the events a pause let pile up do not
        pass for a burst. A fast engine's output is read at once (a short request must not wait
        for its DONE), as is anything while a request waits for its first token or is at its last
        token (max_tokens: its DONE is next) or has been stopped or cancelled (its DONE or
        CANCELLED is next; the engine reader ends a pause when a command is written). Any other
        DONE waits at most READ_PAUSE_S."""
        running = len(self.by_id)
        if (not running or not events or cycle * running / events < SLOW_TOKEN_S
                or any(r.t_first is None or r.tokens >= r.job.max_tokens - 1 or r.stopped or r.cancelled
                       for r in self.by_id.values())):
            return 0.0
        return min(self.text_frame_s, READ_PAUSE_S)

    def emit_text(self, r, final=False):
        """Sends the new text, holding back a tail that may still grow into a stop string; a
        complete stop string cuts the text there and STOPs the engine. Matching is linear in the
        text (engine_bridge.stops): no stop list can stall the loop every stream shares."""
        if not r.stopped and r.job.stop:
            if r.matcher is None:
                r.matcher = StopMatcher(r.job.stop)
            hit = r.matcher.feed(r.text[r.matcher.pos:])
            if hit:
                cut, r.stop_sequence = hit
                self.emit(r, {"kind": "text", "text": r.text[r.sent:cut]})
                r.sent, r.text = cut, r.text[:cut]
                self.stop(r)
                return
        held = r.matcher.held if r.matcher is not None else 0
        end = len(r.text) if final or r.stopped else len(r.text) - held
        if end > r.sent:
            self.emit(r, {"kind": "text", "text": r.text[r.sent:end]})
            r.sent = end

    def finish(self, r, final):
        self.emit(r, final)
        self.requests.pop(r.req, None)
        if r.eng_id is not None:
            self.by_id.pop(r.eng_id, None)
        elapsed = time.monotonic() - r.t_submit
        log.info("req %s id=%s slot=%s prompt=%s reused=%s out_chars=%d ttft=%s %.2fs -> %s",
                 r.req, r.eng_id, r.slot, r.prompt_tokens, r.reused, len(r.text),
                 f"{r.t_first - r.t_submit:.3f}" if r.t_first else "-", elapsed,
                 final.get("finish_reason") or final.get("code"))

    def release(self, r):
        if r.job is not None:
            self.start_all(self.scheduler.release(r.req, r.job.prompt + r.text))

    # --- engine hooks (called from the supervisor / the engine's reader task) ------------------

    def on_ready_facts(self, engine):
        """For an engine that sends no MODEL line (the real colibri binary), the served model's
        facts are what the bridge started it with; MODEL, when it comes, replaces them."""
        if engine.model_info is None:
            self.publisher.update(model=started_facts())

    def on_status(self, status):
        self.publisher.update(status=status, up=status == "up", restarts=self.supervisor.restarts)

    def on_ready(self, engine):
        self.on_ready_facts(engine)
        self.scheduler.paused = False
        self.start_all(self.scheduler.dispatch())

    def on_down(self, reason):
        self.scheduler.paused = True
        self.block = {}
        for r in list(self.by_id.values()):
            self.emit_text(r, final=True)
            self.finish(r, {"kind": "error", "code": "ENGINE_DIED", "message": DIED_MESSAGE})
        self.scheduler.reset()
        self.start_all([])

    def on_start_failed(self, reason):
        """The engine could not start: nobody waiting may be parked behind the next attempt."""
        for r in [r for r in self.requests.values() if r.eng_id is None]:
            self.scheduler.remove(r.req)
            self.finish(r, self._unavailable())
        self.start_all([])

    def on_event(self, ev):
        kind = type(ev)
        handler = self.handlers.get(kind)
        if handler is None:  # once per event type: one engine line per token comes through here
            handler = self.handlers[kind] = getattr(self, "ev_" + kind.__name__.lower(), None) or (lambda ev: None)
        handler(ev)

    def ev_model(self, ev):
        self.publisher.update(model=ev.info)

    def ev_hwinfo(self, ev):
        self.block["hwinfo"] = ev.__dict__
        self.publisher.update(hwinfo=ev.__dict__)

    def ev_tiers(self, ev):
        self.publisher.update(tiers=ev.__dict__)

    def ev_emap(self, ev):
        self.publisher.update(emap=ev.__dict__, seq=self.publisher.state["seq"] + 1)

    def ev_hits(self, ev):
        self.publisher.update(hits=ev.__dict__, seq=self.publisher.state["seq"] + 1)

    def ev_gpus(self, ev):
        self.block["gpus"] = ev.gpus
        self.publisher.update(gpus=ev.gpus)

    def ev_entropy(self, ev):
        self.block["entropy"] = ev.values
        self.publisher.update(entropy=ev.values)

    def ev_repin(self, ev):
        self.block.setdefault("repin", []).append(ev.__dict__)
        self.publisher.add_repin(ev.__dict__)

    def ev_prof(self, ev):
        self.block["prof"] = ev.values

    def ev_perf(self, ev):
        r = self.by_id.get(ev.id)
        if r:
            r.perf = ev.values

    def ev_routes(self, ev):
        r = self.by_id.get(ev.id)
        if r:
            r.routing = {"rows": ev.rows, "cols": ev.cols, "counts": ev.counts}

    def ev_iostat(self, ev):
        figures = ev.figures()
        self.publisher.update(iostat=figures)  # the latest turn's, engine-wide (/v1/stats, /ops)
        r = self.by_id.get(ev.id)
        if r:
            r.io = figures

    def ev_accept(self, ev):
        r = self.by_id.get(ev.id)
        if r is None or r.prompt_tokens is not None:
            if r is not None:
                log.error("duplicate ACCEPT for id %s", ev.id)
            return
        r.prompt_tokens, r.reused = ev.prompt_tokens, ev.extras.get("reused")
        self.emit(r, {"kind": "accepted", "prompt_tokens": ev.prompt_tokens, "slot": r.slot,
                      "reused": r.reused})

    def ev_data(self, ev):
        r = self.by_id.get(ev.id)
        if r is None or r.cancelled or r.stopped:
            return
        r.tokens += 1
        r.text += r.decoder.decode(ev.data)
        if r.job.logprobs and ev.logprob is not None:
            r.lp_pending.append(logprob_entry(ev))
        self.emit_text(r)

    def ev_topk(self, ev):
        r = self.by_id.get(ev.id)
        if r and r.job.topk and not (r.cancelled or r.stopped):
            r.topk.append(ev.candidates)
            self.emit(r, {"kind": "topk", "candidates": ev.candidates})

    def ev_done(self, ev):
        block, self.block = self.block, {}
        self.publisher.add_turn({"hit_pct": ev.hit_pct, "tok_s": ev.tok_s, "completion_tokens": ev.emitted})
        r = self.by_id.get(ev.id)
        if r is None:
            return
        if r.cancelled:
            self.finish(r, {"kind": "error", "code": "CANCELLED", "message": "Cancelled."})
            return self.release(r)
        if not r.stopped:
            r.text += r.decoder.decode(b"", final=True)
        self.emit_text(r, final=True)
        ttft = round(r.t_first - r.t_submit, 4) if r.t_first else None
        self.finish(r, {
            "kind": "done",
            "finish_reason": "length" if ev.length_limited and not r.stopped else "stop",
            "stop_sequence": r.stop_sequence,
            "usage": {"prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.emitted},
            "stats": {"tok_s": ev.tok_s, "hit_pct": ev.hit_pct, "rss_gb": ev.rss_gb, "ttft_s": ttft,
                      "first_token_at": r.t_first_wall},
            "reused": r.reused,
            "perf": r.perf or block.get("prof"),
            "entropy": block.get("entropy"),
            "gpus": block.get("gpus"),
            "repin": block.get("repin", []),
            "topk": r.topk if r.job.topk else None,
            "routing": r.routing if r.job.routes else None,
            "io": r.io,
            **({"logprobs": r.lp_pending} if r.lp_pending else {}),  # tokens whose text was empty or held
        })
        self.release(r)

    def ev_error(self, ev):
        r = self.by_id.get(ev.id)
        if r is None or ev.code == "NOT_FOUND":
            if ev.id != 0 and ev.code != "NOT_FOUND":
                log.error("engine error for unknown id %s: %s", ev.id, ev.message)
            return
        if ev.code == "CANCELLED":
            final = {"kind": "error", "code": "CANCELLED", "message": "Cancelled."}
        elif ev.code == "CONTEXT_EXCEEDED":
            final = {"kind": "error", "code": "CONTEXT_EXCEEDED", "n": ev.n, "limit": ev.limit,
                     "message": f"The prompt is too long: at least {ev.n} tokens, the limit is {ev.limit}."}
        elif ev.code in ("BAD_REQUEST", "EMPTY_PROMPT"):
            final = {"kind": "error", "code": "BAD_REQUEST", "message": ev.message}
        else:
            if ev.code in ("SLOT_BUSY", "DUPLICATE_ID"):
                log.error("bridge bug: engine said %s for id %s", ev.code, ev.id)
            final = {"kind": "error", "code": "ENGINE_ERROR", "message": ev.message}
        if ev.code == "BAD_FRAME":
            return  # the engine exits; on_down reports ENGINE_DIED
        self.emit_text(r, final=True)
        self.finish(r, final)
        self.release(r)
