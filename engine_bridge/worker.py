"""The bridge worker: the only owner of the engine. Takes gen.submit / gen.cancel / gen.stop from
its inbox and relays each request's events to the request's reply list in numbered batches
(engine_bridge.transport, docs/contracts.md).

`Bridge` is a coordinator: it owns the tasks and wires the parts, each owning one concern and
readable whole:
* engine_bridge.admission — the requests, the bounded queue and slots, submit / cancel / stop,
  the requesters' leases;
* engine_bridge.streams — a running request's engine events: text, stop strings, its end;
* engine_bridge.pacing — when events leave and how they reach the reply lists (batching, the
  engine read pause);
* engine_bridge.telemetry_events — the engine-wide telemetry lines, into the published state;
* engine_bridge.engine — the engine process and its pipe (Supervisor), with this class as the
  supervisor's hooks.

Several bridges share one Redis, each under its own id (settings.BRIDGE_ID): its own inbox,
heartbeat and state keys, and a registration (engine_bridge.registry: model, load, what each slot
holds) written with every beat, which the web side routes by (engine_bridge.routing).

Failure containment: a Redis outage never ends the worker (receives and sends retry with a
backoff; the engine and its slots live on); a heartbeat (engine_bridge.liveness) lets waiting
clients notice a dead bridge; an engine that stops answering is reported (watch_engine), not
restarted.
"""
import asyncio
import logging
import time
from collections.abc import Callable

from django.conf import settings

from engine_bridge import registry, transport
from engine_bridge.admission import Admission, send_command
from engine_bridge.engine import Engine, Supervisor, next_id
from engine_bridge.jobs import Request, extension_refusal, parse_job, started_facts  # noqa: F401 (public names)
from engine_bridge.liveness import Heart
from engine_bridge.pacing import REDIS_RETRY_FIRST, REDIS_RETRY_MAX, Pacer
from engine_bridge.scheduler import Scheduler, Slot
from engine_bridge.streams import Streams
from engine_bridge.telemetry import Publisher
from engine_bridge.telemetry_events import EngineTelemetry

log = logging.getLogger(__name__)

WATCH_S = 0.5        # how often the bridge looks at its engine (watch_engine)
PING_AFTER_S = 2.0   # an engine silent this long is asked something it must answer
HUNG_AFTER_S = 10.0  # that question unanswered this long (no output, no work): the engine is hung
ALIVE_EVERY_S = 10.0  # a silent engine that works (a long prefill) keeps its streams alive this often


class Bridge:
    def __init__(self, command: tuple[list[str], dict[str, str]] | None = None,
                 ready_timeout: float | None = None) -> None:
        self.scheduler = Scheduler(settings.KV_SLOTS, settings.BRIDGE_QUEUE_LIMIT)
        self.scheduler.paused = True
        self.supervisor = Supervisor(self, command, ready_timeout)
        self.id = transport.bridge_id()
        self.publisher = Publisher(self.id)
        self.publisher.update(slots=settings.KV_SLOTS)
        self.heart = Heart(self.id, self.registration)
        self.host, self.fingerprint = registry.host_name(), registry.model_fingerprint(str(settings.ENGINE_MODEL))
        self.chains = registry.SlotChains()
        self.described: tuple[object, str, str] = (object(), "", "")  # (model info, its id, its rev); none yet
        running: dict[int, Request] = {}  # engine id -> Request: admission writes it, the pacer reads it
        self.pacer = Pacer(running)
        self.admission = Admission(self.scheduler, self.supervisor, self.pacer, self.publisher, self.heart, running)
        self.telemetry = EngineTelemetry(self.publisher)
        self.streams = Streams(self.admission, self.pacer, self.telemetry)
        self.handlers: dict[type, Callable] = {**self.telemetry.handlers(), **self.streams.handlers()}

    async def run(self) -> None:
        tasks = [asyncio.create_task(self.supervisor.run()), asyncio.create_task(self.publisher.run()),
                 asyncio.create_task(self.heart.run()), asyncio.create_task(self.watch_engine()),
                 asyncio.create_task(self.admission.watch_leases())]
        try:
            while True:
                for message in await receive(self.id):
                    try:
                        self.handle(message)
                    except Exception:
                        log.exception("bad bridge message %r", message.get("type"))
        finally:
            await self.shutdown(tasks)

    def handle(self, message: dict) -> None:
        kind, req = message.get("type"), message.get("req")
        admission = self.admission
        if kind == "gen.submit":
            admission.submit(req, message.get("boot"), message.get("job"), message.get("reply"),
                             leased=message.get("lease") is True)
        elif kind == "gen.cancel" and req in admission.requests:
            admission.cancel(admission.requests[req])
        elif kind == "gen.stop" and req in admission.requests:
            admission.stop(admission.requests[req])

    def registration(self) -> dict:
        """What the heartbeat registers (engine_bridge.registry.BridgeInfo's fields): read from
        the scheduler and the published state at each beat, the slot chains computed once per text."""
        state, slots = self.publisher.state, self.scheduler.slots
        info = state.get("model")
        if info is not self.described[0]:  # the model facts changed (MODEL line): its id and rev once
            from engine_bridge.served import served_model_from

            self.described = (info, served_model_from({"model": info}).id, registry.model_rev(info))
        return registry.registration_dict(registry.BridgeInfo(
            id=self.id, host=self.host, boot=self.heart.boot, model=self.described[1], fingerprint=self.fingerprint,
            context=int((info or {}).get("ctx") or settings.ENGINE_CTX), slots=len(slots),
            busy=sum(1 for s in slots if s.busy is not None), queued=len(self.scheduler.queue),
            beat_age_s=0.0, status=str(state.get("status") or "down"), queue_limit=self.scheduler.queue_limit,
            model_rev=self.described[2], admitted=self.admission.admitted, ended=self.admission.ended,
            held=tuple(registry.SlotHeld(s.key, self.chains.chain(s.index, self.slot_text(s))) for s in slots)))

    def slot_text(self, slot: Slot) -> str:
        """What a slot's cache holds, for routers: a running request's prompt (prefilled as it
        starts, so its next turn finds it even before it ends), else its last prompt + output."""
        r = self.admission.requests.get(slot.busy) if slot.busy is not None else None
        return r.job.prompt if r is not None and r.job is not None else slot.text

    async def watch_engine(self) -> None:
        """Keeps telemetry `hung` true while the running engine is stopped (SIGSTOP: /proc says
        so, seen within WATCH_S) or does not answer: an engine silent for PING_AFTER_S gets a STOP
        of an id no request uses, which an engine reading its commands answers at once (ERROR <id>
        NOT_FOUND, ignored by Streams.error); no output and no work (Engine.sample: CPU time,
        storage reads) HUNG_AFTER_S after it means hung. An engine in a long forward (a long
        prompt's prefill under a small memory budget reads no command for minutes) works, so it
        is not hung, and its running streams get an `alive` event every ALIVE_EVERY_S, which
        keeps their clients from giving up on a silent bridge (client.IDLE_TIMEOUT). /health
        reports `hung` (issue 24); the engine is not restarted for it, and it clears once the
        engine answers."""
        ping_at, work, worked_at, alive_at = None, None, time.monotonic(), 0.0
        while True:
            await asyncio.sleep(WATCH_S)
            engine, hung, now = self.supervisor.engine, False, time.monotonic()
            if engine is None:
                ping_at, work = None, None
            else:
                seen = engine.sample()
                if seen.work is not None and seen.work != work:
                    work, worked_at = seen.work, now
                if ping_at is not None and engine.last_output > ping_at:
                    ping_at = None  # it spoke since the question
                if seen.stopped:
                    hung = True
                elif ping_at is None and now - engine.last_output > PING_AFTER_S:
                    ping_at = now
                    send_command(engine.stop(next_id()))
                elif ping_at is not None and now - ping_at > HUNG_AFTER_S and now - worked_at > HUNG_AFTER_S:
                    hung = True
                silent, working = now - engine.last_output > ALIVE_EVERY_S, now - worked_at < ALIVE_EVERY_S
                if not hung and silent and working and now - alive_at > ALIVE_EVERY_S:
                    alive_at = now
                    for r in list(self.pacer.running.values()):
                        self.pacer.emit(r, {"kind": "alive"})
            if hung != self.publisher.state.get("hung", False):
                (log.error if hung else log.warning)("engine %s", "stopped or not answering" if hung else "answers again")
                self.publisher.update(hung=hung)

    async def shutdown(self, tasks: list[asyncio.Task]) -> None:
        self.scheduler.paused = True
        await self.supervisor.shutdown()
        for r in list(self.admission.requests.values()):
            self.admission.finish(r, {"kind": "error", "code": "ENGINE_UNAVAILABLE",
                                      "message": "The engine bridge is shutting down."})
        await self.pacer.drain()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.publisher.close()
        await self.heart.close()

    # --- the supervisor's hooks (called from it or from the engine's reader task) ---------------

    def on_status(self, status: str) -> None:
        self.publisher.update(status=status, up=status == "up", restarts=self.supervisor.restarts)
        self.heart.wake()

    def on_refused(self, reason: str) -> None:
        """The engine refused its model file: /health and the ops page say why (status "refused")."""
        self.publisher.update(refused=reason)

    def on_ready(self, engine: Engine) -> None:
        self.publisher.update(refused=None)
        self.telemetry.ready(engine.model_info)
        self.scheduler.paused = False
        self.admission.start_all(self.scheduler.dispatch())

    def on_down(self, reason: str) -> None:
        self.scheduler.paused = True
        self.telemetry.reset()
        self.streams.engine_down()
        self.scheduler.reset()
        self.admission.start_all([])

    def on_start_failed(self, reason: str) -> None:
        """The engine could not start: nobody waiting may be parked behind the next attempt."""
        self.admission.fail_waiting(self.admission.unavailable())

    def on_event(self, ev: object) -> None:
        handler = self.handlers.get(type(ev))
        if handler is not None:  # other kinds (STAT, CAPS, ...) are the engine's own business
            handler(ev)

    def read_pause(self, events: int, cycle: float) -> float:
        return self.pacer.read_pause(events, cycle)


async def receive(bridge: str) -> list[dict]:
    """The next messages of the bridge's inbox (a burst at once), riding out a Redis outage."""
    delay = REDIS_RETRY_FIRST
    while True:
        try:
            messages = await transport.bridge_next(bridge)
            if messages:
                return messages
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            log.error("reading the bridge inbox failed (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REDIS_RETRY_MAX)
