"""Is the bridge that took my request still the one running? A small Redis key answers it fast.

The bridge worker writes "<prefix>:bridge:<id>:alive" = its boot id every BEAT seconds with a TTL of
TTL seconds (<id>: settings.BRIDGE_ID, "main" by default), and with it its registration
(engine_bridge.registry), in one pipeline. A client waiting for events reads it whenever nothing arrived for a while: a missing
key (the bridge died or was killed) or another boot id (a supervisor restarted it, and the new
process knows nothing of the old one's requests) ends the wait with a clean error within about
TTL + BEAT seconds, instead of the 120 s idle timeout. The telemetry state has a TTL of its own,
far longer, because it is a cache of the last engine facts, not a heartbeat.

Redis outages: the writer keeps beating through them (errors are logged, not raised); a reader
that cannot reach Redis gets None, i.e. "cannot tell", never "dead". A Redis that restarted has
lost every key, so for its first YOUNG_BROKER_S a missing key says nothing either
(`abroker_is_young`): the bridge writes it again at its next beat once it has reconnected.

Freshness (issue 24): the key outlives a dead bridge by up to TTL seconds, which /health must
not take for life. The bridge beats every BEAT = 0.5 s, so the key's remaining time to live says
how old the last beat is (TTL - PTTL); older than STALE_S means the bridge stopped beating
(killed, frozen by SIGSTOP, or its event loop stuck), and `ahealth_facts` reports it within that.
"""
import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis
import redis.asyncio
from django.conf import settings

from engine_bridge import transport

log = logging.getLogger(__name__)

BEAT = 0.5
TTL = 3
STALE_S = 1.5          # a beat older than this: the bridge is not beating (3 beats missed)
HEALTH_TIMEOUT_S = 0.4  # /health's bound on each Redis read: it must answer while Redis hangs
YOUNG_BROKER_S = 2 * TTL  # a Redis up for less than this may simply not have had a beat yet
EARLY_BEAT_GAP_S = 0.02  # a woken heart beats at most this often (slot changes come in bursts)


def alive_key(bridge: str | None = None) -> str:
    """`<prefix>:bridge:<id>:alive`; None: this process's own bridge id (transport.bridge_id)."""
    return transport.bridge_key(bridge, "alive")


def _client() -> redis.asyncio.Redis:
    return transport.loop_client("liveness", socket_timeout=2)


def boot_from(raw: bytes | None) -> str:
    """The alive key's stored value as a boot id ("" when no bridge runs)."""
    return raw.decode() if raw else ""


async def aget_boot(bridge: str | None = None) -> str | None:
    """The running boot id of `bridge` (None: this process's bridge id); "" when none runs; None
    when Redis cannot be reached."""
    try:
        raw = await _client().get(alive_key(bridge))
    except (redis.RedisError, OSError):
        return None
    return boot_from(raw)


async def abroker_is_young() -> bool:
    """Has Redis been up for less than YOUNG_BROKER_S (a restart that lost every beat)? True when
    Redis cannot be reached (cannot tell); False where INFO is refused (a managed Redis that
    renamed it), so a dead bridge is still seen there."""
    try:
        info = await _client().info("server")
    except redis.ResponseError:
        return False
    except (redis.RedisError, OSError):
        return True
    return int(info.get("uptime_in_seconds", YOUNG_BROKER_S)) < YOUNG_BROKER_S


def get_boot(bridge: str | None = None) -> str | None:
    try:
        raw = transport.process_client("liveness", socket_timeout=2).get(alive_key(bridge))
    except (redis.RedisError, OSError):
        return None
    return boot_from(cast(bytes | None, raw))  # redis-py annotates get as `Awaitable | Any`


@dataclass
class HealthFacts:
    """What /health decides from, read in one round trip: the telemetry state's raw JSON, the
    running boot ("" when no bridge beats) and the age of its last beat in seconds (0 for a key
    without expiry, which no bridge writes but a test may)."""
    state_raw: bytes | None
    boot: str
    beat_age: float | None

    @property
    def bridge_beating(self) -> bool:
        return bool(self.boot) and self.beat_age is not None and self.beat_age <= STALE_S


async def ahealth_facts(bridge: str | None = None) -> HealthFacts | None:
    """The facts of /health about `bridge` (None: this process's bridge id), or None when Redis
    did not answer within HEALTH_TIMEOUT_S (down, or frozen: a stopped server still completes TCP
    handshakes, so only a read timeout tells)."""
    client = transport.loop_client("health", socket_timeout=HEALTH_TIMEOUT_S,
                                   socket_connect_timeout=HEALTH_TIMEOUT_S)
    try:
        async with asyncio.timeout(2 * HEALTH_TIMEOUT_S):  # connect + read: 0.8 s at most
            async with client.pipeline(transaction=False) as pipe:
                # redis-py annotates a pipeline's commands as the client's (`Awaitable | Any`); they return it
                pipe.get(transport.bridge_key(bridge, "state")).get(alive_key(bridge)).pttl(  # type: ignore[union-attr]
                    alive_key(bridge))
                state_raw, raw_boot, pttl = await pipe.execute()
    except (redis.RedisError, OSError, TimeoutError):
        return None
    age = None
    if raw_boot and pttl is not None:
        age = 0.0 if pttl < 0 else max(0.0, TTL - pttl / 1000)
    return HealthFacts(state_raw, boot_from(raw_boot), age)


class Heart:
    """The bridge's side: beats until closed; clears its keys on a clean stop.

    With `describe` (the bridge's registration, engine_bridge.registry.registration_dict), every
    beat also writes `<prefix>:bridge:<id>:reg` with the same TTL and adds the id to the registry's
    set, in the same round trip; wake() asks for an early beat (a slot changed hands), taken at
    most every EARLY_BEAT_GAP_S, so routers see a conversation's slot before its next turn."""

    def __init__(self, bridge: str | None = None, describe: Callable[[], dict] | None = None) -> None:
        self.boot = uuid.uuid4().hex
        self.bridge = bridge or transport.bridge_id()
        self.describe = describe
        self.client = redis.asyncio.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        self.failing = False
        self.beats = 0  # beats written (the first may overwrite a dead predecessor's key: no alarm)
        self.woken = asyncio.Event()

    def wake(self) -> None:
        self.woken.set()

    async def beat(self) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(alive_key(self.bridge), self.boot, ex=TTL, get=True)
            if self.describe is not None:
                pipe.set(transport.bridge_key(self.bridge, "reg"), json.dumps(self.describe()), ex=TTL)
                pipe.sadd(transport.bridges_key(), self.bridge)
            before = (await pipe.execute())[0]
        if before and before.decode() != self.boot and self.beats:  # another process beat under our id
            log.error("another bridge runs with id %r (boot %s): two bridges of one id share an inbox "
                      "and each ignores the other's submits; give each its own BRIDGE_ID", self.bridge,
                      before.decode())
        self.beats += 1

    async def run(self) -> None:
        while True:
            self.woken.clear()
            try:
                await self.beat()
                if self.failing:
                    log.warning("Redis is reachable again; heartbeat resumed")
                self.failing = False
            except (redis.RedisError, OSError) as exc:
                if not self.failing:
                    log.error("heartbeat to Redis failed (%s); the engine keeps running, retrying", exc)
                self.failing = True
            except Exception:  # a bug in describe() must not stop the heartbeat: beat without it
                log.exception("writing the bridge registration failed")
                self.describe = None
            await asyncio.sleep(EARLY_BEAT_GAP_S)
            try:
                await asyncio.wait_for(self.woken.wait(), BEAT - EARLY_BEAT_GAP_S)
            except TimeoutError:
                pass

    async def close(self) -> None:
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.delete(alive_key(self.bridge), transport.bridge_key(self.bridge, "reg"))
                pipe.srem(transport.bridges_key(), self.bridge)
                await pipe.execute()
        except (redis.RedisError, OSError):
            pass
        finally:
            await self.client.aclose()
