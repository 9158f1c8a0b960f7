"""Latest engine telemetry, kept in Redis by the bridge worker so every web process can read it.

Key: "<CACHES.default.KEY_PREFIX>:bridge:<id>:state" (default "colibri:bridge:main:state"; one
per bridge, <id> its settings.BRIDGE_ID) in the Redis database of settings.REDIS_URL: one JSON
object, written at once when a field readers act on
changes (URGENT: status, model, ...), otherwise at most every MIN_INTERVAL (the HITS/EMAP figures,
which pages get pushed anyway) and at least every HEARTBEAT seconds, with a TTL of STALE_AFTER
seconds; the worker deletes it when it stops.
A missing key means no bridge is running: get_state() then reports up=False and updated=None.

Pushed too: every update of the fields in PUSHED (and every REPIN) also goes, numbered, to the
Channels group GROUP as {"type": "telemetry.batch", "boot", "bridge", "items": [{"n", ...}]} so pages (the
expert atlas) see every HITS window without polling, and a reader can tell a lost item by a gap in
`n` (per `boot`, i.e. per bridge process). Items are never merged or dropped for speed, but they
leave at most every PUSH_MIN_INTERVAL as one batch: the engine writes HITS every 6 tokens, ~100 a
second under load, and a group send per HITS cost the bridge more CPU than the tokens themselves.
While the group has no member (nobody has the atlas open; asked at most every WATCH_CHECK_S on
layers that can tell), items are dropped instead of sent: a page that opens starts from the
state's snapshot and gets pushes within WATCH_CHECK_S. On a 2-core host every send is a wakeup of
the bridge and Redis that preempts an engine thread.
"""
import asyncio
import json
import logging
import time
import uuid
from typing import Any, cast

import redis
import redis.asyncio
from django.conf import settings

from colibri_base.layers import channel_layer
from engine_bridge import transport

log = logging.getLogger(__name__)

HEARTBEAT = 5.0
STALE_AFTER = 15
MIN_INTERVAL = 0.5  # between two writes for telemetry-only changes
URGENT = ("up", "status", "model", "restarts", "slots", "hung", "refused")  # fields /health and the API act on: written at once
WATCH_CHECK_S = 1.0  # how often the pusher asks whether anybody is in the group
REPIN_KEEP = 64
GROUP = "telemetry"
PUSHED = ("up", "status", "model", "tiers", "emap", "hits", "entropy", "busy", "queue")
PUSH_KEEP = 5000  # items held while the channel layer is slow; older ones are dropped (a gap in n)
PUSH_MIN_INTERVAL = 0.05  # seconds between two group sends (20 a second: smooth flashes on the atlas)


def state_key(bridge: str | None = None) -> str:
    """One bridge's state key; None: this process's own bridge id (transport.bridge_id)."""
    return transport.bridge_key(bridge, "state")


def _reader_bridge(bridge: str | None) -> str:
    """The bridge a reader means: the one named, else the registry's default (the first live
    bridge serving the default model), else this process's bridge id."""
    if bridge:
        return bridge
    from engine_bridge import registry

    return registry.default_bridge(registry.safe_bridges_get())


async def _areader_bridge(bridge: str | None) -> str:
    if bridge:
        return bridge
    from engine_bridge import registry

    return registry.default_bridge(await registry.asafe_bridges_get(registry.SNAPSHOT_REUSE_S))


def empty_state() -> dict[str, Any]:
    return {
        "up": False, "status": "down", "model": None, "hwinfo": None, "tiers": None,
        "iostat": None,  # the last finished turn's IOSTAT figures (protocol.IoStat.figures), our engine only
        "slot_memory": None,  # {slot: protocol.SlotMem.figures()} after each slot's last turn, our engine only
        "emap": None, "hits": None, "seq": 0, "gpus": None, "entropy": None, "repin": [],
        "slots": 0, "busy": 0, "queue": 0, "restarts": 0, "updated": None, "hung": False,
        "refused": None,  # the engine's reason for refusing its model file (status "refused"), else None
    }


def decode_state(raw: bytes | str | None) -> dict[str, Any]:
    """The stored state's JSON (bytes or None) as get_state() answers it."""
    state = empty_state()
    if raw:
        state.update(json.loads(raw))
    return state


def get_state(bridge: str | None = None) -> dict:
    """One bridge's latest telemetry (see docs/contracts.md; None: the default bridge,
    _reader_bridge); up=False when no bridge/engine is running."""
    raw = transport.process_client("telemetry", socket_timeout=5).get(state_key(_reader_bridge(bridge)))
    return decode_state(cast(bytes | None, raw))  # redis-py annotates get as `Awaitable | Any`


def _aclient() -> redis.asyncio.Redis:
    return transport.loop_client("telemetry", socket_timeout=5)


async def aget_state(bridge: str | None = None) -> dict:
    return decode_state(await _aclient().get(state_key(await _areader_bridge(bridge))))


async def aget_state_and_boot(bridge: str | None = None) -> tuple[dict, str]:
    """(aget_state(bridge), liveness.aget_boot(bridge)'s answer) in one round trip."""
    from engine_bridge.liveness import alive_key, boot_from

    bridge = await _areader_bridge(bridge)
    raw, boot = await _aclient().mget(state_key(bridge), alive_key(bridge))
    return decode_state(raw), boot_from(boot)


class Publisher:
    """The worker's side: holds the state in memory, writes it throttled (to its bridge's key)."""

    def __init__(self, bridge: str | None = None) -> None:
        self.key = state_key(bridge)
        self.bridge = bridge or transport.bridge_id()  # named in every push: pages show one bridge
        self.state = empty_state()
        self.dirty = asyncio.Event()
        self.client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        self.boot = uuid.uuid4().hex[:12]
        self.pushed = 0
        self.push_items: list[dict] = []
        self.push_ready = asyncio.Event()
        self.urgent = asyncio.Event()
        self.watched, self.watch_checked = True, float("-inf")

    def update(self, **fields: Any) -> None:
        self.state.update(fields)
        self.dirty.set()
        if any(k in URGENT for k in fields):
            self.urgent.set()
        item = {k: v for k, v in fields.items() if k in PUSHED}
        if item:
            self._push(item)

    def add_repin(self, entry: dict) -> None:
        self.state["repin"] = (self.state["repin"] + [entry])[-REPIN_KEEP:]
        self.dirty.set()
        self._push({"repin": entry})

    def add_turn(self, entry: dict) -> None:
        """A finished turn's own figures (its DONE), pushed only: the atlas plots hit % per turn."""
        self._push({"turn": entry})

    def _push(self, item: dict) -> None:
        self.pushed += 1
        item["n"] = self.pushed
        self.push_items.append(item)
        del self.push_items[:-PUSH_KEEP]
        self.push_ready.set()

    async def push_loop(self) -> None:
        """Sends what accumulated since the last send as one group message, in order."""
        layer = channel_layer()
        failing = False
        while True:
            await self.push_ready.wait()
            self.push_ready.clear()
            items, self.push_items = self.push_items, []
            if not await self._watched(layer):
                continue
            try:
                await layer.group_send(GROUP, {"type": "telemetry.batch", "boot": self.boot, "bridge": self.bridge,
                                               "items": items})
                failing = False
                await asyncio.sleep(PUSH_MIN_INTERVAL)  # what arrives meanwhile leaves as the next batch
            except Exception as exc:  # Redis outage: once per outage in the log, and a breath
                if not failing:
                    log.warning("pushing telemetry to group %r failed (%s); dropping until Redis is back", GROUP, exc)
                failing = True
                await asyncio.sleep(0.5)

    async def _watched(self, layer: Any) -> bool:  # duck-typed: a channels-redis layer, or any other
        """Whether the group has a member, asked at most every WATCH_CHECK_S (channels-redis keeps
        a group as a sorted set; a layer that cannot tell counts as watched)."""
        group_key = getattr(layer, "_group_key", None)
        if group_key is None:
            return True
        now = time.monotonic()
        if now - self.watch_checked < WATCH_CHECK_S:
            return self.watched
        self.watch_checked = now
        try:
            connection = layer.connection(layer.consistent_hash(GROUP))
            self.watched = bool(await connection.zcard(group_key(GROUP)))
        except Exception:  # Redis out: group_send will say so
            self.watched = True
        return self.watched

    async def write(self) -> None:
        self.state["updated"] = time.time()
        await self.client.set(self.key, json.dumps(self.state), ex=STALE_AFTER)

    async def run(self) -> None:
        pusher = asyncio.create_task(self.push_loop())
        try:
            while True:
                try:
                    await asyncio.wait_for(self.dirty.wait(), HEARTBEAT)
                except asyncio.TimeoutError:
                    pass
                self.dirty.clear()
                self.urgent.clear()
                try:
                    await self.write()
                except (redis.RedisError, OSError) as exc:
                    # Redis outage: keep the state in memory and write it again once Redis is back.
                    log.warning("telemetry write failed (%s); retrying", exc)
                    self.dirty.set()
                    await asyncio.sleep(1.0)
                try:  # a pause between writes, cut short by an urgent change
                    await asyncio.wait_for(self.urgent.wait(), MIN_INTERVAL)
                except asyncio.TimeoutError:
                    pass
        finally:
            pusher.cancel()

    async def close(self) -> None:
        """Delete the state, so readers see at once that no bridge is running."""
        try:
            await self.client.delete(self.key)
        except (redis.RedisError, OSError):
            pass
        finally:
            await self.client.aclose()
