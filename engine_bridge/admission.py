"""Which requests the bridge holds, where each runs, and when each ends: the submit / cancel /
stop commands, the bounded queue and KV slots (engine_bridge.scheduler), and the requesters'
leases.

Why refusals are immediate: a request that arrives while the engine is not up is answered
ENGINE_UNAVAILABLE at once with a `retry_after` hint, never parked behind a restart that may not
come; one that would wait in a full queue gets QUEUE_FULL.

Invariants: `requests` holds every request from its admission to its final event and `running`
(engine id -> request) those on the engine, so every request gets exactly one final event
(finish); a slot is handed out again only once the engine acknowledged its request's end (DONE,
CANCELLED or its death: release / reset); engine commands go out at once (a SUBMIT) or through
send_command, and their failure is the supervisor's business (on_down), never a request's.
"""
import asyncio
import logging
import re
import time
from collections.abc import Coroutine

from engine_bridge import transport
from engine_bridge.engine import EngineFailed, Supervisor, next_id
from engine_bridge.jobs import UNREAD_JOB, Request, extension_refusal, parse_job
from engine_bridge.liveness import Heart
from engine_bridge.pacing import Pacer
from engine_bridge.reasoning import splitter_for
from engine_bridge.route_phases import PhaseRouting
from engine_bridge.scheduler import Job, QueueFull, Scheduler
from engine_bridge.telemetry import Publisher

log = logging.getLogger(__name__)

UNAVAILABLE_MESSAGE = "The engine is not running right now (it is {status}); retry in {retry_after} s."
QUEUE_FULL_RETRY_S = 2  # what a refused client is told to wait: about one short turn
REPLY_NAME = re.compile(r"[0-9A-Za-z_-]{1,64}")  # a client's reply list name (part of a Redis key)
LEASE_CHECK_S = 0.5  # how often the bridge checks the leases of the requesters it serves
LEASE_GRACE_S = 1.5  # a lease missing this long after it was last seen (or Redis came back): gone
CANCELLED = {"kind": "error", "code": "CANCELLED", "message": "Cancelled."}


def send_command(coro: Coroutine) -> None:
    """Writes an engine command without waiting: an engine that fails the write is going down,
    and the supervisor's on_down fails its requests."""
    async def run() -> None:
        try:
            await coro
        except EngineFailed as exc:
            log.warning("engine write failed: %s", exc)
    asyncio.create_task(run())


class Admission:
    def __init__(self, scheduler: Scheduler, supervisor: Supervisor, pacer: Pacer, publisher: Publisher,
                 heart: Heart, running: dict[int, Request]) -> None:
        self.scheduler, self.supervisor, self.pacer = scheduler, supervisor, pacer
        self.publisher, self.heart = publisher, heart
        self.requests: dict[str, Request] = {}  # req -> Request (queued or running)
        self.running = running                  # engine id -> Request (the pacer reads it too)
        self.lease_seen: dict[str, float] = {}  # reply list -> when its lease was last seen (or assumed) alive
        # Requests admitted (queued or started) and ended since this boot: each registration
        # carries both counts and each request's events its ordinals ("admitted" on its first and
        # final events, "ended" on its final), so a router knows exactly which of its requests a
        # registration shows (engine_bridge.client._unseen).
        self.admitted = self.ended = 0

    def submit(self, req: object, boot: object, raw_job: object, reply_to: object = None,
               leased: bool = False) -> None:
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
            self.finish(Request(req, UNREAD_JOB, reply_to),
                        {"kind": "error", "code": "BAD_REQUEST", "message": str(exc)})
            return
        r = Request(req, job, reply_to, leased=leased and reply_to != req,
                    split=splitter_for(job.reasoning, job.prompt))
        if engine is None:
            self.finish(r, self.unavailable())
            return
        refusal = extension_refusal(job, engine.model_info)
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
        self.admitted += 1
        r.admitted = self.admitted
        self.start_all(started)

    def unavailable(self) -> dict:
        status, retry_after = self.supervisor.status, self.supervisor.retry_after()
        message = UNAVAILABLE_MESSAGE.format(status=status, retry_after=retry_after)
        if status == "refused" and self.supervisor.refusal:  # an operator must change the file
            message = f"The engine refused its model file: {self.supervisor.refusal}"
        return {"kind": "error", "code": "ENGINE_UNAVAILABLE", "retry_after": retry_after, "message": message}

    def start_all(self, started: list[tuple[Job, int]]) -> None:
        """Starts what the scheduler handed out, tells the waiting their new places."""
        for job, slot in started:
            self.start(self.requests[job.req], slot)
        for req, position in self.scheduler.positions().items():
            r = self.requests.get(req)
            if r and r.position != position:
                r.position = position
                self.pacer.emit(r, {"kind": "queued", "position": position, "admitted": r.admitted})
        self.publisher.update(queue=len(self.scheduler.queue),
                              busy=sum(1 for s in self.scheduler.slots if s.busy is not None))
        self.heart.wake()  # routers see the slot's new owner and text before its next turn

    def start(self, r: Request, slot: int) -> None:
        r.eng_id, r.slot, r.position = next_id(), slot, None
        self.running[r.eng_id] = r
        engine = self.supervisor.engine
        assert engine is not None  # the scheduler starts nothing while the engine is down (paused)
        if r.job.routes:
            if r.routing is None:
                r.routing = PhaseRouting(reasoning=r.split is not None)
            r.routing.leg(engine.route_steps(r.job))
        try:
            engine.send(engine.submit_command(r.eng_id, slot, r.job))
        except EngineFailed as exc:  # the engine is going down: on_down fails r with the others
            log.warning("engine write failed: %s", exc)

    def cancel(self, r: Request) -> None:
        if r.eng_id is None:
            self.scheduler.remove(r.req)
            self.finish(r, dict(CANCELLED))
            self.start_all([])
        elif not r.cancelled:
            r.cancelled = True
            engine = self.supervisor.engine
            assert engine is not None  # r runs on it: on_down would have ended r
            send_command(engine.cancel(r.eng_id))

    def stop(self, r: Request) -> None:
        if r.eng_id is None:
            self.cancel(r)
        elif not (r.cancelled or r.stopped):
            r.stopped = True
            engine = self.supervisor.engine
            assert engine is not None  # r runs on it: on_down would have ended r
            send_command(engine.stop(r.eng_id))

    def stop_leg(self, r: Request) -> None:
        """STOP r's generation without ending r (a thinking budget's continuation follows)."""
        engine = self.supervisor.engine
        if r.eng_id is not None and engine is not None:
            send_command(engine.stop(r.eng_id))

    def finish(self, r: Request, final: dict) -> None:
        """r's final event: it leaves the bridge's books (its slot stays busy until release)."""
        self.ended += 1
        final["ended"] = self.ended
        if r.admitted:
            final["admitted"] = r.admitted
        self.pacer.emit(r, final)
        self.requests.pop(r.req, None)
        if r.eng_id is not None:
            self.running.pop(r.eng_id, None)
        elapsed = time.monotonic() - r.t_submit
        log.info("req %s id=%s slot=%s prompt=%s reused=%s out_chars=%d ttft=%s %.2fs -> %s",
                 r.req, r.eng_id, r.slot, r.prompt_tokens, r.reused, len(r.text),
                 f"{r.t_first - r.t_submit:.3f}" if r.t_first else "-", elapsed,
                 final.get("finish_reason") or final.get("code"))

    def release(self, r: Request) -> None:
        """The engine is done with r's slot: the slot remembers its text, the queue moves."""
        if r.job is not None:
            self.start_all(self.scheduler.release(r.req, r.job.prompt + r.text))

    def fail_waiting(self, final: dict) -> None:
        """Ends every request not on the engine with `final` (the engine could not start)."""
        for r in [r for r in self.requests.values() if r.eng_id is None]:
            self.scheduler.remove(r.req)
            self.finish(r, dict(final))
        self.start_all([])

    # --- leases -------------------------------------------------------------------------------

    async def watch_leases(self) -> None:
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

    def requester_gone(self, listener: str) -> None:
        """Cancels the requests of a requester whose lease expired: queued ones leave the queue,
        running ones get CANCEL (their slots free once the engine acknowledges)."""
        gone = [r for r in self.requests.values() if r.leased and r.reply_to == listener]
        log.warning("requester %s is gone (lease expired): cancelling its %d requests", listener, len(gone))
        self.lease_seen.pop(listener, None)
        for r in gone:
            self.cancel(r)
