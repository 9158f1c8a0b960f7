"""More concurrent API clients than slots + queue on the live stack (issue 12 "done when"): every
client gets either a complete answer or a 429 with Retry-After in its surface's envelope, none
is lost or cut, and the engine is not restarted; every client that waited for a slot was told
its position (x-colibri-queue-position, `: queued position=N` before its first event). Prints
the figures."""
import threading
import time
from collections import Counter

import httpx
import pytest

from api.models import ApiKey
from tests.web.live import slots_held
from tests.web.sse_oracles import check_anthropic_stream, check_openai_stream

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE_LIMIT = 32  # settings.BRIDGE_QUEUE_LIMIT's default, which the live stack runs with


def test_more_clients_than_slots_and_queue(live_stack, alice):
    key = ApiKey.issue(user=alice, name="load")[1]
    headers = {"Authorization": f"Bearer {key}"}
    model = httpx.get(live_stack.url + "/v1/models", headers=headers).json()["data"][0]["id"]
    slots = int(live_stack.env["KV_SLOTS"])
    clients = slots + QUEUE_LIMIT + 16
    restarts = live_stack.bridge_state().get("restarts", 0)
    results = [None] * clients
    go = threading.Event()

    def client(i):
        anthropic = i % 2 == 1
        route = "/v1/messages" if anthropic else "/v1/chat/completions"
        body = {"model": model, "messages": [{"role": "user", "content": f"Story {i} about the sea."}],
                "max_tokens": 1500, "temperature": 0, "stream": True}
        go.wait()
        t0 = time.monotonic()
        try:
            with httpx.stream("POST", live_stack.url + route, json=body, headers=headers, timeout=300) as r:
                raw = r.read().decode()
                results[i] = (route, r.status_code, dict(r.headers), raw, time.monotonic() - t0)
        except Exception as exc:  # a lost client would show here
            results[i] = (route, None, {}, repr(exc), time.monotonic() - t0)

    # Two long streams hold both slots while the clients arrive, so the queue really fills
    # (the fixture model can otherwise finish answers as fast as requests arrive); they are
    # released once the queue has refused someone, and the queued clients are then served.
    with slots_held(live_stack, model, headers, slots) as release:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        go.set()
        deadline = time.monotonic() + 60
        while sum(1 for r in results if r and r[1] == 429) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        release.set()  # the queue has refused someone: let the holders go, the queued are served
        for t in threads:
            t.join(300)
    statuses = Counter(r[1] for r in results)
    problems = []
    told = []
    for route, status, hdrs, raw, _ in results:
        try:
            if status == 200 and "x-colibri-queue-position" in hdrs:
                position = int(hdrs["x-colibri-queue-position"])
                assert 1 <= position <= QUEUE_LIMIT and raw.startswith(f": queued position={position}\n\n")
                told.append(position)
            if status == 200:
                (check_anthropic_stream if route == "/v1/messages" else
                 lambda x: check_openai_stream(x, "chat.completion.chunk"))(raw)
            elif status == 429:
                assert int(hdrs["retry-after"]) >= 1
                assert ('"rate_limit_error"' in raw) and (route != "/v1/messages" or '"type":"error"' in raw)
            else:
                raise AssertionError(f"status {status}: {raw[:200]}")
        except (AssertionError, KeyError, ValueError) as exc:
            problems.append(f"{route} {status}: {exc!r}"[:300])
    served = [r[4] for r in results if r[1] == 200]
    print(f"\n{clients} concurrent clients on {slots} slots + queue {QUEUE_LIMIT}: statuses {dict(statuses)}, "
          f"slowest complete answer {max(served):.1f}s; {len(told)} waited and were told their position "
          f"(first told: {min(told) if told else None}..{max(told) if told else None})")
    assert not problems, problems
    assert statuses[200] >= slots + 1 and statuses[429] >= 1
    assert len(told) >= statuses[200] - slots  # the slots were held: every served client waited
    assert live_stack.bridge_state().get("restarts", 0) == restarts
