"""The bridge's inbox (engine_bridge.transport): a burst of messages comes back in one pop, in
order, and a message that is not a JSON object is dropped alone, not with its burst."""
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
