"""The bridge's telemetry publisher (engine_bridge/telemetry.py) against real Redis (the bridge
tests' database, conftest): pushes go to
the group only while somebody is in it, and a change readers act on is written at once, not after
the pause that throttles the HITS/EMAP figures."""
import asyncio
import json

import pytest
import redis.asyncio
from channels.layers import get_channel_layer

from engine_bridge import telemetry
from tests.bridge.helpers import until

pytestmark = pytest.mark.asyncio
HITS = {"rows": 2, "cols": 8, "hex": "0100"}


async def test_items_go_to_the_group_only_while_somebody_is_in_it(redis_url, monkeypatch):
    monkeypatch.setattr(telemetry, "WATCH_CHECK_S", 0.05)
    layer = get_channel_layer()
    await layer.connection(layer.consistent_hash(telemetry.GROUP)).delete(layer._group_key(telemetry.GROUP))
    sends = []
    real_send = layer.group_send

    async def counting_send(group, message):
        sends.append(message)
        await real_send(group, message)

    monkeypatch.setattr(layer, "group_send", counting_send)
    publisher = telemetry.Publisher()
    pusher = asyncio.create_task(publisher.push_loop())
    try:
        for _ in range(3):
            publisher.update(hits=HITS)
            await asyncio.sleep(0.1)
        assert sends == []                                   # an empty group: nothing sent
        channel = await layer.new_channel()
        await layer.group_add(telemetry.GROUP, channel)
        # a check after the group_add sees the member (every WATCH_CHECK_S): an item published
        # from then on reaches it; one published before that check is dropped, so publish until one arrives
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        message = None
        while message is None:
            assert loop.time() < deadline, "nothing reached the group's member"
            publisher.update(hits=HITS)
            try:
                message = await asyncio.wait_for(layer.receive(channel), 0.5)
            except asyncio.TimeoutError:
                pass
        assert message["type"] == "telemetry.batch" and message["items"][-1]["hits"] == HITS
    finally:
        pusher.cancel()
        await publisher.client.aclose()


async def test_a_status_change_is_written_at_once_while_figures_wait(redis_url, monkeypatch):
    # The pause between figure writes, long enough that no host's scheduling ends it during the
    # test: "the figures wait" and "the status did not wait for the pause" are then about the code.
    monkeypatch.setattr(telemetry, "MIN_INTERVAL", 30.0)
    publisher = telemetry.Publisher()
    runner = asyncio.create_task(publisher.run())
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        loop = asyncio.get_running_loop()
        publisher.update(status="up", up=True)
        async def written() -> bool:
            return await client.get(telemetry.state_key()) is not None

        await until(written, 10, "the first status written")  # written; now the pause runs
        publisher.update(hits=HITS)
        await asyncio.sleep(0.2)
        assert json.loads(await client.get(telemetry.state_key()))["hits"] is None  # figures wait
        publisher.update(status="restarting", up=False)
        deadline = loop.time() + 10                          # well inside the 30 s pause
        while (state := json.loads(await client.get(telemetry.state_key())))["status"] != "restarting":
            assert loop.time() < deadline, "the status change waited for the throttle"
            await asyncio.sleep(0.01)
        assert state["hits"] == HITS                         # and the figures left with it
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await publisher.close()
        await client.aclose()


async def test_the_state_and_the_running_boot_come_in_one_read(redis_url):
    """What a generation request reads before its submit (api.served): the published state and the
    alive bridge's boot, together; no boot ("") once the bridge stopped cleanly."""
    from engine_bridge.liveness import Heart, aget_boot

    publisher, heart = telemetry.Publisher(), Heart()
    runners = [asyncio.create_task(publisher.run()), asyncio.create_task(heart.run())]
    try:
        publisher.update(status="up", up=True, model={"name": "tiny"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2
        while (await aget_boot()) != heart.boot or (await telemetry.aget_state())["model"] is None:
            assert loop.time() < deadline, "the heart or the publisher wrote nothing"
            await asyncio.sleep(0.01)
        state, boot = await telemetry.aget_state_and_boot()
        assert boot == heart.boot and state["model"] == {"name": "tiny"} and state["status"] == "up"
    finally:
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
        await publisher.close()
        await heart.close()
    state, boot = await telemetry.aget_state_and_boot()
    assert boot == "" and state["up"] is False
