"""The reply side of engine_bridge.client: one Listener per event loop (a web process) reads the
loop's reply list (engine_bridge.transport.reply_key) for every request of the loop and holds
the loop's lease (transport.lease_key).

Why one per loop: N streams of a process then cost one blocking pop per round trip, not N, and
one lease tells the bridge that all of them still have a reader.

Invariant: a request's batches reach its queue in the order the bridge pushed them; a batch for a
request no longer registered is dropped (its CANCELLED after the client left).
"""
import asyncio
import logging
import uuid
import weakref

from engine_bridge import transport

log = logging.getLogger(__name__)


class Listener:
    """One event loop's reader of its reply list (engine_bridge.transport): moves each batch to
    the queue of the request it belongs to, so N streams of a web process cost one blocking pop
    per round trip, not N. Callers never cancel it (a pop cancelled mid-flight could lose batches
    of every request of the loop); it ends by itself once the loop has no request registered.

    It also holds the loop's lease (transport.lease_key), renewed every LEASE_BEAT_S while any
    request is registered: when the process dies (kill -9, OOM, a host gone) the lease expires
    and the bridge cancels its requests, so no engine slot keeps generating for nobody (issue 24).
    A Redis outage only delays renewals; the bridge does not judge leases across one."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.queues: dict[str, asyncio.Queue] = {}   # req -> asyncio.Queue of its batches
        self.task: asyncio.Task | None = None
        self.lease_task: asyncio.Task | None = None

    def register(self, req: str) -> asyncio.Queue:
        queue = self.queues[req] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._run())
        if self.lease_task is None or self.lease_task.done():
            self.lease_task = loop.create_task(self._lease())
        return queue

    async def _lease(self) -> None:
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

    def unregister(self, req: str) -> None:
        self.queues.pop(req, None)

    async def _run(self) -> None:
        while self.queues:
            try:
                messages = await transport.replies(self.id)
            except Exception as exc:  # Redis outage: keep trying while anyone waits
                log.warning("reading reply list %s failed (%s); retrying", self.id, exc)
                await asyncio.sleep(0.2)
                continue
            for message in messages:
                queue = self.queues.get(message.get("req", ""))
                if queue is not None:
                    queue.put_nowait(message)


_listeners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def loop_listener() -> Listener:
    """This event loop's listener (made at its first request)."""
    loop = asyncio.get_running_loop()
    if loop not in _listeners:
        _listeners[loop] = Listener()
    return _listeners[loop]
