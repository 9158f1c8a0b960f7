"""The bridge's inbox (engine_bridge.transport): a burst of messages comes back in one pop, in
order, and a message that is not a JSON object is dropped alone, not with its burst; the
messages a web process sends while a push is on its way follow it in one push, and a push Redis refuses fails each of
its senders."""
import asyncio
import json

import pytest
import redis.asyncio

from engine_bridge import transport
from tests.support import procs


@pytest.fixture
def inbox(settings):
    url = procs.claim_redis_db()
    settings.REDIS_URL = url
    yield url
    procs.release_redis_db(url)


@pytest.mark.asyncio
async def test_a_burst_arrives_in_one_pop_in_order_and_a_bad_message_costs_only_itself(inbox):
    client = redis.asyncio.Redis.from_url(inbox)
    await client.delete(transport.inbox_key())
    for i in range(8):
        await transport.to_bridge({"type": "gen.cancel", "req": f"r{i}"})
    await client.rpush(transport.inbox_key(), b"not json", json.dumps([1, 2]))
    await transport.to_bridge({"type": "gen.cancel", "req": "last"})
    messages = await transport.bridge_next()
    assert [m["req"] for m in messages] == [f"r{i}" for i in range(8)] + ["last"]
    assert await client.llen(transport.inbox_key()) == 0
    await client.aclose()


@pytest.mark.asyncio
async def test_messages_sent_while_a_push_is_on_its_way_share_the_next_push_in_order(inbox, monkeypatch):
    client = redis.asyncio.Redis.from_url(inbox)
    await client.delete(transport.inbox_key())
    pushes = []
    real = transport._client

    class CountingPushes:  # the real client, its RPUSHes counted
        async def rpush(self, key, *values):
            pushes.append(len(values))
            return await real().rpush(key, *values)

    monkeypatch.setattr(transport, "_client", CountingPushes)
    await asyncio.gather(*(transport.to_bridge({"type": "gen.submit", "req": f"r{i}"}) for i in range(8)))
    assert pushes == [1, 7]  # the first at once, the rest in one round trip behind it (there were 8)
    await transport.to_bridge({"type": "gen.cancel", "req": "r3"})
    assert pushes == [1, 7, 1]
    monkeypatch.setattr(transport, "_client", real)
    messages = await transport.bridge_next()
    assert [(m["type"], m["req"]) for m in messages] == [("gen.submit", f"r{i}") for i in range(8)] + [("gen.cancel", "r3")]
    await client.aclose()


@pytest.mark.asyncio
async def test_a_push_redis_refuses_fails_each_of_its_senders(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{procs.free_port()}/0"  # nothing listens there
    results = await asyncio.gather(*(transport.to_bridge({"type": "gen.submit", "req": f"r{i}"}) for i in range(3)),
                                   return_exceptions=True)
    assert len(results) == 3 and all(isinstance(r, redis.ConnectionError) for r in results)
