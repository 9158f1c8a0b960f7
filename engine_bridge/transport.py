"""The generation data path between web processes and the bridge: two kinds of plain Redis lists.

* `<prefix>:bridge:<id>:inbox` — gen.submit / gen.cancel / gen.stop messages for bridge <id>
  (settings.BRIDGE_ID, "main" by default; engine_bridge.routing picks it); RPUSH by any web
  process or worker, popped by that bridge (one process per id), a burst at a time.
* `<prefix>:bridge:reply:<listener>` — the numbered event batches of every request of one client
  event loop (a web process), named by the submit's `reply`; RPUSH by the bridge, several batches
  in one command when they are ready together (with an expiry, so an abandoned list disappears),
  popped by that loop's one listener (engine_bridge.client), which takes everything already
  waiting in one round trip, whichever of its requests it belongs to. A submit without `reply`
  gets a list of its own named by its `req`.

Why not the channel layer (issue 14): channels-redis spends three round trips on each received
message (a clean script, the pop, and a backup-queue cleaner that holds a per-channel lock until
it is done) and hands out one message per call, so a reader that fell behind paid for every batch
on its own. Messages are JSON (events are plain data; NaN survives, as Python's json writes it).

A submit names the bridge boot it was meant for (engine_bridge.liveness): a bridge ignores one
addressed to another boot, so a restarted bridge never generates for a client that has already
been told the old one is gone.
"""
import asyncio
import json
import logging
import weakref
from collections.abc import Iterable
from typing import Any

import redis
import redis.asyncio
from django.conf import settings

BROKER_DOWN = "The message broker (Redis) cannot be reached."  # what a user reads while Redis is out

log = logging.getLogger(__name__)

REPLY_TTL = 120          # seconds an unread reply list survives its last batch
LEASE_TTL_S = 2          # a requester's lease outlives its last renewal by this long
LEASE_BEAT_S = 0.5       # how often a requester with requests in flight renews it
POP_BATCH = 512          # batches taken in one round trip once the first has arrived
BLOCK_S = 1.0            # one blocking pop's wait; callers loop (and notice cancellation)


def key_prefix() -> str:
    return settings.CACHES.get("default", {}).get("KEY_PREFIX") or "colibri"


def bridge_id() -> str:
    """This process's bridge id (env BRIDGE_ID): what run_bridge serves as, and the bridge a
    reader means when it names none and the registry has no better answer."""
    return str(getattr(settings, "BRIDGE_ID", "") or "main")


def bridge_key(bridge: str | None, part: str) -> str:
    """`<prefix>:bridge:<id>:<part>`, the keys one bridge owns (inbox, alive, state, reg)."""
    return f"{key_prefix()}:bridge:{bridge or bridge_id()}:{part}"


def bridges_key() -> str:
    """`<prefix>:bridges`: the ids of the registered bridges (engine_bridge.registry)."""
    return f"{key_prefix()}:bridges"


def inbox_key(bridge: str | None = None) -> str:
    return bridge_key(bridge, "inbox")


def reply_key(listener: str) -> str:
    return f"{key_prefix()}:bridge:reply:{listener}"


def lease_key(listener: str) -> str:
    """`<prefix>:bridge:lease:<listener>`: exists while the requester (one client event loop, i.e.
    a web process) behind that reply list lives. Its submits say `"lease": true`; the bridge
    cancels the requests of a listener whose lease is gone (engine_bridge.admission.Admission.watch_leases)."""
    return f"{key_prefix()}:bridge:lease:{listener}"


# Clients per event loop, URL and purpose: a new connection per request cost a millisecond or more
# of every first token, and a client's pool belongs to the loop that made it (Celery makes short
# loops). Blocking pops hold a pooled connection each, so pools are not capped here.
_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], redis.asyncio.Redis]] = \
    weakref.WeakKeyDictionary()


def loop_client(purpose: str, **options: Any) -> redis.asyncio.Redis:
    """This loop's Redis client for `purpose`, made with `options` the first time."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (settings.REDIS_URL, purpose)
    if key not in per_loop:
        per_loop[key] = redis.asyncio.Redis.from_url(settings.REDIS_URL, **{"socket_connect_timeout": 2, **options})
    return per_loop[key]


_process_clients: dict[tuple[str, str], redis.Redis] = {}


def process_client(purpose: str, **options: Any) -> redis.Redis:
    """The process's synchronous Redis client for `purpose` (redis-py's pool is thread-safe): for
    reads from sync code such as /health and the API's served-model facts, which opened a new
    connection per call."""
    key = (settings.REDIS_URL, purpose)
    if key not in _process_clients:
        _process_clients[key] = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, **options)
    return _process_clients[key]


def _client() -> redis.asyncio.Redis:
    return loop_client("transport", socket_timeout=BLOCK_S + 5, health_check_interval=30)


# A loop's messages for one inbox: the first leaves at once; those sent while a push to that
# inbox is on its way wait for it to land, then leave together in the next RPUSH. A burst of 8
# submits costs two round trips instead of 8 (each a send that wakes Redis on a core the engine
# computes on), and the first of them is not held back for the others.
_pushing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, list[tuple[str, asyncio.Future]]]] = \
    weakref.WeakKeyDictionary()


# The ignores below: redis-py annotates its asyncio client's commands as `Awaitable[T] | T` (one
# signature for both clients) and BLMPOP's keys as lists; they are coroutines taking key names.
async def to_bridge(message: dict, bridge: str | None = None) -> None:
    """Appends `message` to a bridge's inbox; returns once Redis has it (raises what Redis
    raised). Messages of this loop for one inbox keep their order."""
    loop = asyncio.get_running_loop()
    key, raw = inbox_key(bridge), json.dumps(message)
    pushing = _pushing.setdefault(loop, {})
    if key in pushing:  # a push is on its way: ride the next one
        landed = loop.create_future()
        pushing[key].append((raw, landed))
        await asyncio.shield(landed)  # a caller that leaves leaves its message sent, as a push would
        return
    pushing[key] = []
    try:
        await _client().rpush(key, raw)  # type: ignore[misc]
    finally:
        if pushing[key]:
            loop.create_task(_push_waiting(key, pushing))
        else:
            del pushing[key]


async def _push_waiting(key: str, pushing: dict[str, list[tuple[str, asyncio.Future]]]) -> None:
    """Sends what waits for `key`, all of it in one RPUSH a round, until nothing does; each
    message's future gets the outcome of the push that carried it."""
    try:
        while pushing.get(key):
            batch, pushing[key] = pushing[key], []
            try:
                await _client().rpush(key, *(raw for raw, _ in batch))  # type: ignore[misc]
                outcome: BaseException | None = None
            except Exception as exc:
                outcome = exc
            for _, landed in batch:
                if landed.done():
                    continue
                if outcome is None:
                    landed.set_result(None)
                else:
                    landed.set_exception(outcome)
                    landed.exception()  # seen: a caller that left raises nowhere
    finally:
        for _, landed in pushing.pop(key, []):  # (left only if this task was cancelled)
            if not landed.done():
                landed.set_exception(ConnectionError("the inbox pusher stopped"))
                landed.exception()


async def bridge_next(bridge: str | None = None) -> list[dict]:
    """The bridge's waiting inbox messages in order (at least one), or [] after BLOCK_S without
    any: one BLMPOP takes a burst of submits (8 clients at once) in one round trip."""
    popped = await _client().blmpop(BLOCK_S, 1, inbox_key(bridge), direction="LEFT",  # type: ignore[misc, arg-type]
                                    count=POP_BATCH)
    return [message for raw in (popped[1] if popped else []) if (message := _inbox_message(raw)) is not None]


def _inbox_message(raw: bytes | str) -> dict | None:
    """A decoded inbox message, or None (logged) for one that is not a JSON object: a bad message
    costs only itself, not the burst it was popped with."""
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        log.error("dropping a bridge inbox message that is not a JSON object: %r", raw[:200])
        return None
    return message


async def reply(listener: str, messages: Iterable[dict]) -> None:
    """Appends batches (in order) to a listener's reply list, in one round trip."""
    async with _client().pipeline(transaction=False) as pipe:
        pipe.rpush(reply_key(listener), *(json.dumps(message) for message in messages))
        pipe.expire(reply_key(listener), REPLY_TTL)
        await pipe.execute()


async def replies(listener: str) -> list[dict]:
    """Every batch waiting for a listener (at least one), or [] after BLOCK_S without any: one
    BLMPOP (Redis 7) takes up to POP_BATCH at once, so a reader pays one round trip however far
    behind it is and however many of its requests are streaming."""
    popped = await _client().blmpop(BLOCK_S, 1, reply_key(listener), direction="LEFT",  # type: ignore[misc, arg-type]
                                    count=POP_BATCH)
    if not popped:
        return []
    return [json.loads(raw) for raw in popped[1]]


def _lease_client() -> redis.asyncio.Redis:
    return loop_client("lease", socket_timeout=2)


async def lease_renew(listener: str) -> None:
    await _lease_client().set(lease_key(listener), 1, ex=LEASE_TTL_S)


async def leases_alive(listeners: Iterable[str]) -> list[bool]:
    """[bool] per listener, in order: whose lease exists now (one round trip)."""
    async with _client().pipeline(transaction=False) as pipe:
        for listener in listeners:
            pipe.exists(lease_key(listener))
        return [bool(n) for n in await pipe.execute()]


async def forget(listener: str) -> None:
    await _client().delete(reply_key(listener))
