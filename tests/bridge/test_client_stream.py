"""engine_bridge.client.generate's listening (its _Stream) against real Redis, the test playing
the bridge by hand: batches are put in `seq` order and merged, a gap that is not filled ends the
stream, ticks come while nothing arrives and the bridge's liveness is asked after each, and only
the bridge's own final event spares the request its gen.cancel."""
import asyncio
import contextlib

import pytest
import redis.asyncio
from django.conf import settings

from engine_bridge import client, liveness, transport
from engine_bridge.request import GenerationRequest


async def _bridge_by_hand(boot: str) -> redis.asyncio.Redis:
    """The test is the one bridge: registrations a previous file's real bridges left in this
    Redis database (alive up to their 3 s expiry) are forgotten, so the router takes "main"."""
    r = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    await r.delete(transport.inbox_key(), transport.bridges_key())
    await r.set(liveness.alive_key(), boot)
    return r


async def _inbox_types() -> list[str]:
    return [m["type"] for m in await transport.bridge_next()]


def _batch(req: str, seq: int, *events: dict) -> dict:
    return {"type": "gen.events", "req": req, "seq": seq, "events": list(events)}


async def _consume(agen, on_event=None) -> list:
    events = []
    async with contextlib.aclosing(agen):
        async for event in agen:
            events.append(event)
            if on_event:
                await on_event(events)
    return events


@pytest.mark.asyncio
async def test_batches_arrive_in_seq_order_merged_and_a_done_sends_no_cancel():
    r = await _bridge_by_hand("boot-a")

    async def bridge():
        (submit,) = await transport.bridge_next()
        assert submit["boot"] == "boot-a" and submit["job"]["prompt"] == "p"
        req, reply = submit["req"], submit["reply"]
        await transport.reply(reply, [_batch(req, 1, {"kind": "text", "text": "b"}),
                                      _batch(req, 0, {"kind": "text", "text": "a"})])
        await asyncio.sleep(0.1)
        await transport.reply(reply, [_batch(req, 2, {"kind": "done", "finish_reason": "stop"})])

    task = asyncio.create_task(bridge())
    events = await _consume(client.generate(GenerationRequest(prompt="p", max_tokens=4)))
    await task
    assert [e["kind"] for e in events] == ["submitted", "routed", "text", "done"]
    assert events[1] == {"kind": "routed", "bridge": "main"}  # no registry: the default bridge
    assert events[2]["text"] == "ab"           # seq 1 waited for seq 0; both left as one delta
    assert await _inbox_types() == []          # the bridge ended it: nothing to cancel
    await r.aclose()


@pytest.mark.asyncio
async def test_a_gap_not_filled_ends_the_stream_and_cancels(monkeypatch):
    monkeypatch.setattr(client, "GAP_TIMEOUT", 0.2)
    r = await _bridge_by_hand("boot-a")

    async def bridge():
        (submit,) = await transport.bridge_next()
        await transport.reply(submit["reply"], [_batch(submit["req"], 1, {"kind": "text", "text": "b"})])

    task = asyncio.create_task(bridge())
    events = await _consume(client.generate(GenerationRequest(prompt="p", max_tokens=4)))
    await task
    assert [e["kind"] for e in events] == ["submitted", "routed", "error"]
    assert events[-1]["code"] == "ENGINE_ERROR" and "seq 0" in events[-1]["message"]
    assert await _inbox_types() == ["gen.cancel"]
    await r.aclose()


@pytest.mark.asyncio
async def test_ticks_come_while_nothing_arrives_and_a_restart_seen_after_one_ends_the_stream():
    r = await _bridge_by_hand("boot-a")
    loop = asyncio.get_running_loop()
    resumed = []

    async def on_event(events):
        if events[-1] is None and events.count(None) == 2:
            await r.set(liveness.alive_key(), "boot-b")  # the bridge restarted during the tick
            resumed.append(loop.time())

    request = GenerationRequest(prompt="p", max_tokens=4)
    events = await _consume(client.generate(request, tick=lambda: 0.4), on_event)
    assert events[0]["kind"] == "submitted" and events[2:4] == [None, None]
    assert len(events) == 5 and events[4]["code"] == "ENGINE_UNAVAILABLE"
    # liveness is asked as soon as the caller took the tick, not a tick later
    assert loop.time() - resumed[0] < 0.2
    assert "restarted" in events[4]["message"]
    assert await _inbox_types() == ["gen.submit", "gen.cancel"]
    await r.aclose()


@pytest.mark.asyncio
async def test_a_redis_restart_that_lost_the_beat_does_not_end_the_stream(private_redis):
    """A restarted Redis has no alive key until the bridge's next beat; a stream that asks then must
    wait for that beat, not report its bridge gone (the bridge and its engine never stopped)."""
    r = await _bridge_by_hand("boot-a")
    loop = asyncio.get_running_loop()

    async def bridge():
        (submit,) = await transport.bridge_next()
        private_redis.stop()
        private_redis.start()  # empty: the alive key is gone, as after any Redis restart
        await asyncio.sleep(2.5 * client.LIVENESS_POLL)  # the stream asks liveness at least twice
        beat = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        await beat.set(liveness.alive_key(), "boot-a", ex=liveness.TTL)  # the bridge's next beat
        await transport.reply(submit["reply"], [_batch(submit["req"], 0, {"kind": "text", "text": "x"},
                                                       {"kind": "done", "reason": "stop"})])
        await beat.aclose()
        return loop.time()

    task = asyncio.create_task(bridge())
    events = await _consume(client.generate(GenerationRequest(prompt="p", max_tokens=4)))
    await task
    assert [e["kind"] for e in events if e] == ["submitted", "routed", "text", "done"], events
    await r.aclose()
