"""A request waiting for the engine must not hold up the rest of the site (issue 14).

While every KV slot is busy and more API requests wait in the bridge's queue (their views
awaiting ACCEPT), other pages and API calls of the same Daphne process still answer at once.
"""
import asyncio
import time

import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def _body(text, max_tokens):
    return {"model": "colibri", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}


async def _hold(client, url, headers, text):
    """A streaming request that keeps its slot (or its queue place) until cancelled."""
    async with client.stream("POST", url, json=_body(text, 100_000), headers=headers) as r:
        async for _ in r.aiter_lines():
            pass


async def _queued(live_stack, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if live_stack.bridge_state().get("queue", 0) >= 1:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_queued_request_does_not_block_other_requests(live_stack, alice_key):
    headers = {"Authorization": f"Bearer {alice_key}"}
    url = f"{live_stack.url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        # More streams than the live stack's 2 slots: while the engine serves two, the rest wait
        # in the bridge's queue, their views awaiting ACCEPT.
        holders = [asyncio.create_task(_hold(client, url, headers, f"Tell me a long story about a hummingbird, part {i}."))
                   for i in range(6)]
        measured = 0
        try:
            for _ in range(5):
                if not await _queued(live_stack):
                    break
                for path, auth in (("/v1/models", headers), ("/health", {}), ("/accounts/login/", {})):
                    t0 = time.monotonic()
                    r = await client.get(f"{live_stack.url}{path}", headers=auth)
                    elapsed = time.monotonic() - t0
                    assert r.status_code in (200, 503), (path, r.status_code)
                    assert elapsed < 1.0, f"{path} took {elapsed:.2f}s while requests waited for a slot"
                if live_stack.bridge_state().get("queue", 0) >= 1:
                    measured += 1
                await asyncio.sleep(0.1)
        finally:
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
        assert measured >= 1, "no moment with a request waiting in the queue was measured"


async def _idle(live_stack, timeout=15, quiet=0.5):
    """Waits until no slot is busy and nothing is queued for `quiet` seconds in a row."""
    deadline, since = time.monotonic() + timeout, None
    while True:
        state = live_stack.bridge_state()
        if state.get("busy", 0) == 0 and state.get("queue", 0) == 0:
            since = since or time.monotonic()
            if time.monotonic() - since >= quiet:
                return
        else:
            since = None
        assert time.monotonic() < deadline, f"the engine kept generating for a client that left: {state}"
        await asyncio.sleep(0.05)


async def test_a_buffered_request_is_cancelled_when_its_client_leaves(live_stack, alice_key):
    """The async view is cancelled on disconnect, which cancels the engine job (its slot frees)."""
    await _idle(live_stack, 30)  # earlier tests' generations have ended
    headers = {"Authorization": f"Bearer {alice_key}"}
    # 120,000 tokens: uncancelled, the fixture model needs far longer than _idle waits
    body = {**_body("Tell me a long story about a hummingbird.", 120_000), "stream": False}
    async with httpx.AsyncClient(timeout=60) as client:
        task = asyncio.create_task(client.post(f"{live_stack.url}/v1/chat/completions", json=body, headers=headers))
        deadline = time.monotonic() + 20
        while live_stack.bridge_state().get("busy", 0) < 1:
            assert time.monotonic() < deadline, "the request never started"
            await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await _idle(live_stack)


async def test_a_stream_is_cancelled_when_its_client_leaves(live_stack, alice_key):
    await _idle(live_stack, 30)
    headers = {"Authorization": f"Bearer {alice_key}"}
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{live_stack.url}/v1/chat/completions", headers=headers,
                                 json=_body("Tell me a long story about a hummingbird.", 100_000)) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    break
    await _idle(live_stack)
