"""The orphan sweep: no reply stays `streaming` after the process that generated it is gone.

Why: a relay (chat/relay.py) is a task in one web process; when that process dies (kill -9, OOM,
a host lost) nothing finishes its message, and it used to stay `streaming` across restarts until
someone opened the conversation. Every web process runs one sweeper task on its event loop
(`ensure_started`, called by the ASGI entry point and by the consumer before every relay start),
which

* renews the process's lease, `chat:relay:alive:<relay.PROCESS>` in the cache, every BEAT_S with
  a TTL of OWNER_TTL_S: the owner of the streaming messages it relays (Message.relay_owner);
* sweeps at once (start-up) and then every SWEEP_S: services.messages_interrupt_orphans marks
  every streaming message whose owner's lease is gone `interrupted` (partial text kept: saved every
  RELAY_SAVE_EVERY_S by its relay, and the rest from its tail log, chat.relay.recovered_text) and
  publishes its final state to the conversation's sockets.

Invariants: a live process's messages are never swept (its lease is renewed far more often than
it expires, and a process never sweeps its own); while Redis cannot say whose lease exists, and for
OWNER_TTL_S + BEAT_S after an outage (a restarted Redis lost every lease), nothing is swept.
"""
import asyncio
import logging

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache

from chat import relay, server_frames, services

log = logging.getLogger(__name__)

BEAT_S = 1.0
OWNER_TTL_S = 5
SWEEP_S = 5.0
_tasks: dict = {}  # event loop -> its sweeper task


def owner_key(owner: str) -> str:
    return f"chat:relay:alive:{owner}"


def owners_alive(owners: set) -> dict:
    """{owner: whether its lease exists} (this process always lives); raises when the cache cannot
    be read. An owner of another deployment (relay.deployment_tag) counts as alive: its leases and
    tail logs are in another cache, so this one can neither judge it nor recover its text (a
    sweep from there stored the row's last save, short of what its reader had)."""
    mine = relay.PROCESS[:8]
    others = [o for o in owners if o != relay.PROCESS and o.startswith(mine)]
    found = cache.get_many([owner_key(o) for o in others]) if others else {}
    return {o: o == relay.PROCESS or not o.startswith(mine) or owner_key(o) in found for o in owners}


def ensure_started() -> None:
    """Starts this loop's sweeper once (idempotent; cheap enough for every ASGI call). Off where
    settings.CHAT_ORPHAN_SWEEP is false (in-process tests, whose loops are short-lived)."""
    if not getattr(settings, "CHAT_ORPHAN_SWEEP", True):
        return
    loop = asyncio.get_running_loop()
    task = _tasks.get(loop)
    if task is None or task.done():
        _tasks[loop] = loop.create_task(run(), name="chat-orphan-sweeper")


async def sweep_once() -> int:
    """One sweep; returns how many messages it ended (0 when Redis or the database is out)."""
    try:
        ended = await database_sync_to_async(services.messages_interrupt_orphans)(owners_alive, relay.recovered_text)
    except Exception as exc:  # cannot tell whose lease lives: sweep nothing this round
        log.warning("orphan sweep skipped (%s)", exc)
        return 0
    for msg in ended:
        await relay.drop_tail(msg.pk, msg.relay_owner)  # the row holds what it recovered
        log.warning("message %s of conversation %s was left streaming by a process that is gone; "
                    "marked %s", msg.pk, msg.conversation_id, msg.status)
        try:
            await relay.publish(msg.conversation_id, server_frames.done(msg.as_dict()))
        except Exception:  # a reload shows it anyway
            log.warning("could not publish the end of message %s", msg.pk, exc_info=True)
    return len(ended)


async def run() -> None:
    """Renews the lease every BEAT_S; sweeps at once and every SWEEP_S, but never within
    OWNER_TTL_S + BEAT_S of a Redis outage's end: a restarted Redis has lost every lease, and the
    other processes need that long to renew theirs before their messages may be judged."""
    loop = asyncio.get_running_loop()
    next_sweep = loop.time()
    ok_since: float | None = float("-inf")  # at start-up Redis counts as having been fine
    while True:
        try:
            await cache.aset(owner_key(relay.PROCESS), 1, timeout=OWNER_TTL_S)
            if ok_since is None:
                ok_since = loop.time()
        except Exception as exc:
            if ok_since is not None:
                log.warning("renewing the relay lease failed (%s); no sweep until Redis is back", exc)
            ok_since = None
        settled = ok_since is not None and loop.time() - ok_since >= OWNER_TTL_S + BEAT_S
        if settled and loop.time() >= next_sweep:
            await sweep_once()
            next_sweep = loop.time() + SWEEP_S
        await asyncio.sleep(BEAT_S)
