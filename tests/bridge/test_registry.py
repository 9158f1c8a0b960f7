"""engine_bridge.registry against real Redis, the test playing the bridges' hearts: a
registration written with the heartbeat reads back as BridgeInfo in one snapshot; a bridge that
stops beating leaves the snapshot within liveness.STALE_S and its id the set once its keys
expire; a clean stop removes it at once; a second process beating under one id is logged."""
import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio
from django.conf import settings

from engine_bridge import liveness, registry, transport
from engine_bridge.registry import BridgeInfo, SlotHeld


def _describe(bridge: str, heart: liveness.Heart, busy: int = 0) -> dict:
    return registry.registration_dict(BridgeInfo(
        id=bridge, host="host-" + bridge, boot=heart.boot, model="tiny", fingerprint="1-abc", context=256, slots=2,
        busy=busy, queued=0, beat_age_s=0.0, status="up", queue_limit=4,
        held=(SlotHeld("conv:1", registry.prefix_chain("x" * 600)), SlotHeld(None, ""))))


async def _live_ids() -> list[str]:
    return [b.id for b in await registry.abridges_get()]


async def _until(predicate: Callable[[], Awaitable[bool]], timeout: float) -> float:
    """Seconds until `predicate()` (a coroutine function) is true; fails after `timeout`."""
    t0 = time.monotonic()
    while not await predicate():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    r = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    await r.delete(transport.bridges_key())
    yield r
    await r.aclose()


async def test_a_registration_reads_back_whole_and_leaves_at_a_clean_stop(client: redis.asyncio.Redis) -> None:
    heart = liveness.Heart("reg-a")
    heart.describe = lambda: _describe("reg-a", heart, busy=1)
    task = asyncio.create_task(heart.run())
    try:
        await _until(lambda: _has("reg-a"), 2)
        (info,) = [b for b in await registry.abridges_get() if b.id == "reg-a"]
        assert (info.host, info.boot, info.model, info.slots, info.busy, info.load) == (
            "host-reg-a", heart.boot, "tiny", 2, 1, 0.5)
        assert info.held[0].conversation == "conv:1" and len(info.held[0].chain) == 2 * registry.DIGEST_CHARS
        assert 0 <= info.beat_age_s <= liveness.STALE_S
        assert [b.id for b in registry.bridges_get()] == await _live_ids()  # the sync reader agrees
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await heart.close()
    assert "reg-a" not in await _live_ids() and not await client.sismember(transport.bridges_key(), "reg-a")


async def _has(bridge: str) -> bool:
    return bridge in await _live_ids()


async def test_a_bridge_that_stops_beating_leaves_the_rotation_within_the_stale_bound(
        client: redis.asyncio.Redis) -> None:
    hearts = {name: liveness.Heart(name) for name in ("reg-b", "reg-c")}
    tasks = {}
    for name, heart in hearts.items():
        heart.describe = (lambda n, h: lambda: _describe(n, h))(name, heart)
        tasks[name] = asyncio.create_task(heart.run())
    try:
        await _until(lambda: _has("reg-b"), 2)
        await _until(lambda: _has("reg-c"), 2)
        tasks["reg-b"].cancel()  # killed: no clean stop, its keys linger until their TTL
        gone_after = await _until(lambda: _gone("reg-b"), 3)
        assert gone_after <= liveness.STALE_S + 0.3 and await _has("reg-c")
        await _until(lambda: _unlisted(client, "reg-b"), liveness.TTL + 1)  # the reader dropped its id
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for heart in hearts.values():
            await heart.close()


async def _gone(bridge: str) -> bool:
    return not await _has(bridge)


async def _unlisted(client: redis.asyncio.Redis, bridge: str) -> bool:
    await registry.abridges_get()
    return not await client.sismember(transport.bridges_key(), bridge)


async def test_a_registration_of_another_boot_is_not_live_and_two_hearts_of_one_id_are_logged(
        client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture) -> None:
    first, second = liveness.Heart("reg-d"), liveness.Heart("reg-d")
    first.describe = lambda: _describe("reg-d", first)
    await first.beat()
    assert await _has("reg-d")
    await client.set(liveness.alive_key("reg-d"), "someone-else", ex=liveness.TTL)  # the beat is not its boot's
    assert not await _has("reg-d")
    await first.beat()  # (it says so: the key held another boot)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="engine_bridge.liveness"):
        await second.beat()  # its first beat: a dead predecessor's key may be there, no alarm
        assert not caplog.records
        await first.beat()   # the key holds the second heart's boot
    assert any("another bridge runs with id 'reg-d'" in r.getMessage() for r in caplog.records)
    await first.close()
    await second.close()


async def test_the_served_model_read_and_the_route_share_one_registry_read(
        client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """An API request reads the served model (engine_bridge.served) and then routes
    (client._admissible): one registry round trip for both (issue 26), the route's snapshot
    dating each beat as a fresh read would."""
    from engine_bridge import client as generation, served
    from engine_bridge.request import GenerationRequest

    heart = liveness.Heart("reg-once")
    heart.describe = lambda: _describe("reg-once", heart)
    await heart.beat()
    try:
        reads = []
        real_decode = registry._decode_rows  # every registry read, sync or async, decodes its rows once
        monkeypatch.setattr(registry, "_decode_rows", lambda rows: (reads.append(1), real_decode(rows))[1])
        facts = await served.aserved_model_get("tiny")
        assert facts is not None and facts.bridges == ("reg-once",) and len(reads) == 1
        await asyncio.sleep(0.02)
        target, refusal = await generation._admissible(GenerationRequest(prompt="hi", max_tokens=1, model="tiny"), None,
                                                       "reg-once-req")
        assert refusal == {} and target is not None and target.bridge == "reg-once" and len(reads) == 1
        (aged,) = [b for b in await registry.abridges_get(generation.ROUTE_SNAPSHOT_S) if b.id == "reg-once"]
        assert aged.beat_age_s >= 0.02 and len(reads) == 1  # the cached snapshot's beat is as old as it is
        assert generation._flights.pop("reg-once-req").bridge == "reg-once"  # routed: counted until it ends
    finally:
        await heart.close()


async def test_a_burst_of_served_model_reads_makes_one_registry_read_and_reads_the_facts_once_per_rev(
        client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 requests at once read the served model: one registry round trip for all of them
    (colibri_base.flight), and the bridge's telemetry state (its model facts) only when the
    registration names facts this process has not read: a new model_rev reads them again."""
    import json

    from engine_bridge import served, telemetry

    facts = {"name": "burst-model", "file": "/models/burst-model.gguf", "ctx": 512, "extensions": True}
    model_id = served.served_model_from({"model": facts}).id
    heart = liveness.Heart("reg-burst")

    def describe(info: dict) -> dict:
        return {**_describe("reg-burst", heart), "model": model_id, "model_rev": registry.model_rev(info)}

    async def publish(info: dict) -> None:
        await client.set(telemetry.state_key("reg-burst"),
                         json.dumps({"up": True, "status": "up", "model": info, "updated": time.time()}))
        heart.describe = lambda: describe(info)
        await heart.beat()

    registry_reads, state_reads = [], []
    real_decode, real_state = registry._decode_rows, telemetry.aget_state
    monkeypatch.setattr(registry, "_decode_rows", lambda rows: (registry_reads.append(1), real_decode(rows))[1])

    async def counted_state(bridge: str | None = None) -> dict:
        state_reads.append(bridge)
        return await real_state(bridge)

    monkeypatch.setattr(telemetry, "aget_state", counted_state)
    try:
        await publish(facts)
        first = await served.aserved_model_get(model_id)
        assert first is not None and first.context_length == 512 and state_reads == ["reg-burst"]
        registry_reads.clear()
        burst = await asyncio.gather(*(served.aserved_model_get(model_id) for _ in range(8)))
        assert [m.context_length for m in burst if m is not None] == [512] * 8
        assert len(registry_reads) == 1 and state_reads == ["reg-burst"]  # the facts were known
        await publish({**facts, "ctx": 1024})  # the bridge's engine came back with other facts
        again = await served.aserved_model_get(model_id)
        assert again is not None and again.context_length == 1024 and state_reads == ["reg-burst"] * 2
    finally:
        await heart.close()
        await client.delete(telemetry.state_key("reg-burst"))
