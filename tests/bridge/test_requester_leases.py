"""Issue 24 item 1, bridge side, with the real bridge worker and engine: a request belongs to a live
requester. A requester whose lease (engine_bridge.transport.lease_key) is not renewed — a web
process killed under its streams — loses its requests within a few seconds and the engine slots
free; one that renews keeps streaming; a Redis outage cancels nothing."""
import asyncio
import contextlib
import time
import uuid

import pytest

from engine_bridge import liveness, transport
from engine_bridge.client import generate
from engine_bridge.request import GenerationRequest
from engine_bridge.telemetry import aget_state
from tests.bridge.conftest import bridge_env
from tests.bridge.helpers import CHATML
from tests.support import procs

LONG = 100_000  # tokens: far longer than any step of these tests


async def _busy():
    return (await aget_state())["busy"]


async def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _submit(listener, prompt, *, lease=True):
    req = uuid.uuid4().hex
    job = {"prompt": CHATML.format(prompt), "max_tokens": LONG, "temperature": 0.0}
    await transport.to_bridge({"type": "gen.submit", "req": req, "boot": await liveness.aget_boot(),
                               "reply": listener, "lease": lease, "job": job})
    return req


async def _events(listener, timeout=10.0):
    deadline = time.monotonic() + timeout
    events = []
    while time.monotonic() < deadline:
        for message in await transport.replies(listener):
            events.extend(message["events"])
        if events:
            return events
    return events


async def test_a_requester_that_stops_renewing_its_lease_loses_its_requests(redis_url, engine_binary, tiny_model):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="131072"))
    try:
        dead = uuid.uuid4().hex  # renewed once, as a process that is then killed -9
        await transport.lease_renew(dead)
        reqs = [await _submit(dead, f"story {i}") for i in range(2)]
        first = await _events(dead)
        assert any(e["kind"] in ("accepted", "text") for e in first), first
        await _wait_for(lambda: _busy_is(2), 10, "both slots busy")
        t0 = time.monotonic()
        await _wait_for(lambda: _busy_is(0), 15, "the orphaned slots to free")
        freed = time.monotonic() - t0
        # lease TTL (2 s) + grace (1.5 s) + a check (0.5 s) + telemetry's 0.5 s write interval
        assert freed < 8, f"orphaned slots freed after {freed:.1f}s"
        print(f"\norphaned slots free {freed:.1f}s after the requester's last renewal")
        finals = []
        deadline = time.monotonic() + 5
        while len(finals) < 2 and time.monotonic() < deadline:
            for message in await transport.replies(dead):
                finals += [e for e in message["events"] if e["kind"] in ("done", "error")]
        assert [e.get("code") for e in finals] == ["CANCELLED", "CANCELLED"], (reqs, finals)
    finally:
        procs.stop(proc)


async def _busy_is(n):
    return await _busy() == n


# A killed Redis (its leases lost with it) is tests/web/test_live_faults.py's websocket case and
# test_failure_containment's outage; frozen is the case only the lease clock can get wrong.
@pytest.mark.parametrize("fault", ["freeze"])
async def test_a_redis_outage_cancels_no_live_requester(private_redis, engine_binary, tiny_model, fault):
    """generate() holds the lease; 3 s of Redis frozen (every lease expires the moment it resumes)
    cancels nothing. (Killed, it would also lose the batches that waited in it, so that stream may
    end with the client's lost-events error instead.)"""
    proc = procs.start_bridge(bridge_env(private_redis.url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="131072"))
    try:
        agen = generate(GenerationRequest(prompt=CHATML.format("a long story"), max_tokens=6000))
        async with contextlib.aclosing(agen):
            async for event in agen:
                if event["kind"] == "text":
                    break
            if fault == "kill":
                private_redis.stop()
                await asyncio.sleep(3)
                private_redis.start()
            else:
                private_redis.freeze()
                await asyncio.sleep(3)
                private_redis.thaw()
            events = await asyncio.wait_for(_rest(agen), 90)
        last = events[-1]
        assert last.get("code") != "CANCELLED", last
        if fault == "freeze":
            assert last["kind"] == "done", last
        else:
            assert last["kind"] == "done" or last.get("code") == "ENGINE_ERROR", last
        assert proc.poll() is None
    finally:
        procs.stop(proc)


async def _rest(agen):
    return [event async for event in agen]
