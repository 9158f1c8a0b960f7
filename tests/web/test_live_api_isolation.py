"""Bad input costs its sender only (issue 25 item 5), against the live stack (Daphne + bridge +
engine on the fixture model): stop lists past the bounds are 400 in the surface's envelope, stop
lists at the bounds stream beside another user's stream without cutting it or stalling the
bridge (/health stays 200), and oversized request heads answer 414 / 431 from Daphne instead of
a dropped connection (raw sockets: no client library in between)."""
import random
import socket
import threading
import time

import httpx
import pytest

from api.models import ApiKey
from engine_bridge.request import MAX_STOP_CHARS, MAX_STOPS

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="isolation")[1]


@pytest.fixture
def model(live_stack, key):
    return httpx.get(live_stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]


def test_heavy_stop_lists_never_cut_another_stream(live_stack, key, model):
    headers = {"Authorization": f"Bearer {key}"}
    budget = 12000
    a_result, health, stop, heavy_done = {}, [], threading.Event(), []

    def stream_a():
        text, finish, usage = "", None, None
        body = {"model": model, "messages": MESSAGES, "max_tokens": budget, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", live_stack.url + "/v1/chat/completions", json=body, headers=headers,
                          timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                import json
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                for c in chunk["choices"]:
                    text += c["delta"].get("content") or ""
                    finish = c["finish_reason"] or finish
                usage = chunk.get("usage") or usage
        a_result.update(text=text, finish=finish, usage=usage, ended=time.monotonic())

    def poll_health():
        while not stop.is_set():
            health.append(httpx.get(live_stack.url + "/health", timeout=5).status_code)
            time.sleep(0.1)

    threads = [threading.Thread(target=stream_a), threading.Thread(target=poll_health)]
    for t in threads:
        t.start()
    rng = random.Random(7)
    heavy = ["".join(rng.choice("abcdefgh ") for _ in range(MAX_STOP_CHARS)) for _ in range(MAX_STOPS)]
    overlapping = ["a" * (MAX_STOP_CHARS - 1) + "z"] + ["a" * k + "q" for k in range(1, MAX_STOPS)]
    with httpx.Client(base_url=live_stack.url, headers=headers, timeout=120) as http:
        for stops in (heavy, overlapping):
            for _ in range(3):
                r = http.post("/v1/messages", json={"model": model, "max_tokens": 400, "temperature": 0, "messages": MESSAGES,
                                                    "stop_sequences": stops, "stream": True})
                assert r.status_code == 200 and "event: message_stop" in r.text, r.text[-500:]
                heavy_done.append(time.monotonic())
        for stops in (["x" * 1000] * 1000, ["x" * 3000] * 300):  # the lists of the issue: refused, cheaply
            r = http.post("/v1/messages", json={"model": model, "max_tokens": 8, "messages": MESSAGES,
                                                "stop_sequences": stops})
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text[:300]
    threads[0].join(timeout=120)
    stop.set()
    threads[1].join(timeout=10)
    assert a_result.get("finish") == "length", a_result.get("finish")
    assert a_result["usage"]["completion_tokens"] == budget and a_result["text"]
    assert health and all(s == 200 for s in health), health
    assert a_result["ended"] > heavy_done[1], "stream A ended before the heavy streams ran: nothing was concurrent"


def _raw(live_stack, request: bytes) -> bytes:
    host, port = live_stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("request_bytes,status", [
    (b"GET /v1/models?q=" + b"x" * 25_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414),
    (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"y" * 60_000 + b"\r\n\r\n", 431),
    (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 900) for i in range(20))
     + b"\r\n", 431),
    (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(600)) + b"\r\n", 431),
], ids=["25KB-url", "60KB-header", "18KB-of-headers", "600-headers"])
def test_oversized_heads_answer_their_status(live_stack, request_bytes, status):
    answer = _raw(live_stack, request_bytes)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    assert b'"code": "' in answer and b"Connection: close" in answer
    # the server goes on serving
    ok = httpx.get(live_stack.url + "/health", timeout=5)
    assert ok.status_code == 200


def test_oversized_heads_answer_httpx_too(live_stack, key):
    r = httpx.get(live_stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}", "X-Big": "y" * 60_000})
    assert r.status_code == 431 and r.json()["error"]["code"] == "request_header_fields_too_large"
    r = httpx.get(live_stack.url + "/v1/models?q=" + "x" * 25_000, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 414
