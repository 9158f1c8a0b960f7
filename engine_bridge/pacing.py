"""When the bridge sends a request's events, and how they reach its reply list (docs/contracts.md,
engine_bridge.transport): numbered batches, at most one per request on its way to Redis.

Why batches, and when: an event that finds no batch of its request in flight leaves at once (the
first token never waits), except text that follows a text batch of the same request sent less
than its text interval ago; events arriving meanwhile coalesce (text merged) and leave together,
and while the batch in flight still waits for its list's sender they join it (a DONE read with
the last DATA leaves with that text: one send, one web-process wakeup fewer per request).
The text interval is a frame (BRIDGE_TEXT_FRAME_S) for one stream and grows with the number of
streams so that all of them together send at most settings.BRIDGE_TEXT_BATCHES_PER_S text batches
a second; held text of concurrent streams leaves together (on_tick), so they share one send and
one web-process wakeup per interval. A batch costs the web path about half a millisecond of CPU
(bridge, Redis, Daphne, bench/webpath.py), and on a small host every such millisecond, and every
wakeup that preempts an engine thread, comes out of the engine's own throughput. For the same
reason an engine that writes a token at a time is read at most every READ_PAUSE_S while every
running request already has its first text (read_pause).

Invariants: a request's batches are numbered from 0 without a gap (the client fails loudly on
one); one sender per reply list sends everything queued for it in one command; a Redis outage
delays batches (retried with a backoff) and drops them only after SEND_GIVE_UP_S.
"""
import asyncio
import logging
import time
from collections.abc import Mapping

from django.conf import settings

from engine_bridge import transport
from engine_bridge.jobs import Request

log = logging.getLogger(__name__)

REDIS_RETRY_FIRST, REDIS_RETRY_MAX = 0.1, 2.0
READ_PAUSE_S = 0.02  # longest wait between reads of a slow (token-at-a-time) engine output
SLOW_TOKEN_S = 0.001  # seconds per token and request from which an engine counts as token-at-a-time
TEXTLIKE = ("text", "reasoning")  # streamed output: merged and paced alike (thinking streams as the answer does)
SEND_GIVE_UP_S = 30.0  # a reply batch not delivered within this long of an outage is dropped


class Pacer:
    """The bridge's outgoing side. `running` is the engine id -> Request map of the requests on
    the engine (engine_bridge.admission owns it; the pacer only reads it)."""

    def __init__(self, running: Mapping[int, Request]) -> None:
        self.running = running
        self.deliveries: set[asyncio.Task] = set()  # tasks sending reply batches
        self.outlets: dict[str, list] = {}     # reply list -> [(request, batch)] waiting for its sender
        self.senders: dict[str, asyncio.Task] = {}  # reply list -> the task sending to it
        self.held: dict[str, tuple[Request, float]] = {}  # req -> (request, due time) of held text
        self.tick: asyncio.TimerHandle | None = None  # sends held text (its when(): the earliest due)
        self.text_batches_per_s = settings.BRIDGE_TEXT_BATCHES_PER_S
        self.text_frame_s = settings.BRIDGE_TEXT_FRAME_S

    def emit(self, r: Request, event: dict) -> None:
        """Queues one event of r; text merges into text already waiting."""
        if event["kind"] in TEXTLIKE:
            if not event["text"]:
                return
            if r.lp_pending and event["kind"] == "text":  # the logprobs of the tokens this text completes travel with it
                event["logprobs"], r.lp_pending = r.lp_pending, []
            if r.t_first is None:
                r.t_first, r.t_first_wall = time.monotonic(), time.time()
            if r.outbox and r.outbox[-1]["kind"] == event["kind"]:
                r.outbox[-1]["text"] += event["text"]
                if "logprobs" in event:
                    r.outbox[-1].setdefault("logprobs", []).extend(event["logprobs"])
                return  # merged into a batch that waits for the one in flight
        r.outbox.append(event)
        self.flush(r)

    def flush(self, r: Request, ride: bool = False) -> None:
        """Starts sending r's waiting events unless a batch of r is already in flight, or unless
        they are only text and a batch with text left less than text_interval() ago: the first
        token and every non-text event leave at once; later text leaves at most once a frame
        (ride: the tick of another stream takes it along, see on_tick). Events that find r's
        batch still queued for its list's sender join it: no send of their own (a DONE read with
        the last DATA leaves with that text)."""
        if not r.outbox:
            return
        if r.sending:
            if r.waiting is not None:
                self.held.pop(r.req, None)
                if any(e["kind"] in TEXTLIKE for e in r.outbox):
                    r.text_sent_at = time.monotonic()
                r.waiting["events"].extend(r.outbox)
                r.outbox = []
            return
        self.held.pop(r.req, None)
        only_text = all(e["kind"] in TEXTLIKE for e in r.outbox)
        if only_text and r.text_sent_at is not None and not ride:
            due = r.text_sent_at + self.text_interval()
            if due > time.monotonic():
                self.hold(r, due)
                return
        if any(e["kind"] in TEXTLIKE for e in r.outbox):
            r.text_sent_at = time.monotonic()
        message = {"type": "gen.events", "req": r.req, "seq": r.seq, "events": r.outbox}
        r.seq, r.outbox, r.sending, r.waiting = r.seq + 1, [], True, message
        self.post(r, message)

    def text_interval(self) -> float:
        """Seconds between two text batches of one request: a screen frame, or the share of the
        batch budget that each running request gets."""
        return max(self.text_frame_s, len(self.running) / self.text_batches_per_s)

    def hold(self, r: Request, due: float) -> None:
        """Holds r's text until `due`; one timer for all held streams, at the earliest due time."""
        self.held[r.req] = (r, due)
        self.arm_tick(due)

    def arm_tick(self, due: float) -> None:
        if self.tick is None or due < self.tick.when():
            if self.tick is not None:
                self.tick.cancel()
            self.tick = asyncio.get_running_loop().call_at(due, self.on_tick)

    def on_tick(self) -> None:
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

    def read_pause(self, events: int, cycle: float) -> float:
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
        running = len(self.running)
        if (not running or not events or cycle * running / events < SLOW_TOKEN_S
                or any(r.t_first is None or r.tokens >= r.job.max_tokens - 1 or r.stopped or r.cancelled
                       for r in self.running.values())):
            return 0.0
        return min(self.text_frame_s, READ_PAUSE_S)

    # --- to Redis -----------------------------------------------------------------------------

    def post(self, r: Request, message: dict) -> None:
        """Queues one batch of r for its reply list; one sender per list sends everything queued
        for it in one command, so streams of one web process share round trips."""
        outlet = self.outlets.setdefault(r.reply_to, [])
        outlet.append((r, message))
        if len(outlet) == 1 and r.reply_to not in self.senders:
            task = asyncio.get_running_loop().create_task(self._deliver(r.reply_to))
            self.senders[r.reply_to] = task
            self.deliveries.add(task)
            task.add_done_callback(self.deliveries.discard)

    async def _deliver(self, listener: str) -> None:
        """Sends what is queued for a reply list until nothing is; each request then sends the
        events that coalesced while its batch was on the way (flush)."""
        try:
            while self.outlets.get(listener):
                batch = self.outlets.pop(listener)
                for r, _ in batch:
                    r.waiting = None  # on its way: later events wait for the next batch
                try:
                    await self._send(listener, [message for _, message in batch])
                finally:
                    for r, _ in batch:
                        r.sending = False
                        self.flush(r)
        finally:
            self.senders.pop(listener, None)

    async def _send(self, listener: str, messages: list[dict]) -> None:
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

    async def drain(self) -> None:
        """Waits (at most SEND_GIVE_UP_S) until every queued batch has left: the bridge is
        stopping and its last events (the shutdown errors) must still reach their clients."""
        deadline = time.monotonic() + SEND_GIVE_UP_S
        while self.deliveries and time.monotonic() < deadline:  # a delivery may chain the next batch
            await asyncio.wait(set(self.deliveries), timeout=max(0.0, deadline - time.monotonic()))
        if self.deliveries:
            log.error("shutting down with %d reply batches undelivered", len(self.deliveries))
