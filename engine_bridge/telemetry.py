"""Latest engine telemetry, kept in Redis by the bridge worker so every web process can read it.

Key: "<CACHES.default.KEY_PREFIX>:bridge:state" (default "colibri:bridge:state") in the Redis
database of settings.REDIS_URL: one JSON object, written at most ~10 times a second and at least
every HEARTBEAT seconds, with a TTL of STALE_AFTER seconds; the worker deletes it when it stops.
A missing key means no bridge is running: get_state() then reports up=False and updated=None.
"""
import asyncio
import json
import time

import redis
import redis.asyncio
from django.conf import settings

HEARTBEAT = 5.0
STALE_AFTER = 15
MIN_INTERVAL = 0.1
REPIN_KEEP = 64


def state_key():
    prefix = settings.CACHES.get("default", {}).get("KEY_PREFIX") or "colibri"
    return f"{prefix}:bridge:state"


def empty_state():
    return {
        "up": False, "status": "down", "model": None, "hwinfo": None, "tiers": None,
        "emap": None, "hits": None, "seq": 0, "gpus": None, "entropy": None, "repin": [],
        "slots": 0, "busy": 0, "queue": 0, "restarts": 0, "updated": None,
    }


def _decode(raw):
    state = empty_state()
    if raw:
        state.update(json.loads(raw))
    return state


def get_state():
    """The latest telemetry (see docs/contracts.md); up=False when no bridge/engine is running."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return _decode(client.get(state_key()))
    finally:
        client.close()


async def aget_state():
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    try:
        return _decode(await client.get(state_key()))
    finally:
        await client.aclose()


class Publisher:
    """The worker's side: holds the state in memory, writes it throttled."""

    def __init__(self):
        self.state = empty_state()
        self.dirty = asyncio.Event()
        self.client = redis.asyncio.Redis.from_url(settings.REDIS_URL)

    def update(self, **fields):
        self.state.update(fields)
        self.dirty.set()

    def add_repin(self, entry):
        self.state["repin"] = (self.state["repin"] + [entry])[-REPIN_KEEP:]
        self.dirty.set()

    async def write(self):
        self.state["updated"] = time.time()
        await self.client.set(state_key(), json.dumps(self.state), ex=STALE_AFTER)

    async def run(self):
        while True:
            try:
                await asyncio.wait_for(self.dirty.wait(), HEARTBEAT)
            except asyncio.TimeoutError:
                pass
            self.dirty.clear()
            await self.write()
            await asyncio.sleep(MIN_INTERVAL)

    async def close(self):
        """Delete the state, so readers see at once that no bridge is running."""
        try:
            await self.client.delete(state_key())
        finally:
            await self.client.aclose()
