"""Is the bridge that took my request still the one running? A small Redis key answers it fast.

The bridge worker writes "<prefix>:bridge:alive" = its boot id every BEAT seconds with a TTL of
TTL seconds. A client waiting for events reads it whenever nothing arrived for a while: a missing
key (the bridge died or was killed) or another boot id (a supervisor restarted it, and the new
process knows nothing of the old one's requests) ends the wait with a clean error within about
TTL + BEAT seconds, instead of the 120 s idle timeout. The telemetry state has a TTL of its own,
far longer, because it is a cache of the last engine facts, not a heartbeat.

Redis outages: the writer keeps beating through them (errors are logged, not raised); a reader
that cannot reach Redis gets None, i.e. "cannot tell", never "dead".
"""
import asyncio
import logging
import uuid

import redis
import redis.asyncio
from django.conf import settings

from engine_bridge import transport

log = logging.getLogger(__name__)

BEAT = 1.0
TTL = 3


def alive_key():
    return f"{transport.key_prefix()}:bridge:alive"


def _client():
    return transport.loop_client("liveness", socket_timeout=2)


def boot_from(raw):
    """The alive key's stored value as a boot id ("" when no bridge runs)."""
    return raw.decode() if raw else ""


async def aget_boot():
    """The running bridge's boot id; "" when none runs; None when Redis cannot be reached."""
    try:
        raw = await _client().get(alive_key())
    except (redis.RedisError, OSError):
        return None
    return boot_from(raw)


def get_boot():
    try:
        raw = transport.process_client("liveness", socket_timeout=2).get(alive_key())
    except (redis.RedisError, OSError):
        return None
    return boot_from(raw)


class Heart:
    """The bridge's side: beats until closed; clears the key on a clean stop."""

    def __init__(self):
        self.boot = uuid.uuid4().hex
        self.client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        self.failing = False

    async def run(self):
        while True:
            try:
                await self.client.set(alive_key(), self.boot, ex=TTL)
                if self.failing:
                    log.warning("Redis is reachable again; heartbeat resumed")
                self.failing = False
            except (redis.RedisError, OSError) as exc:
                if not self.failing:
                    log.error("heartbeat to Redis failed (%s); the engine keeps running, retrying", exc)
                self.failing = True
            await asyncio.sleep(BEAT)

    async def close(self):
        try:
            await self.client.delete(alive_key())
        except (redis.RedisError, OSError):
            pass
        finally:
            await self.client.aclose()
