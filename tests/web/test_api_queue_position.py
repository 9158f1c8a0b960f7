"""The queue position reaches streaming clients (issue 12 item 5), with a scripted bridge: a
stream starts at the bridge's first `queued` event, says the position as SSE comments (all
surfaces), an Anthropic ping and the official Responses `response.queued`, and the response
header; every event still passes the wire oracles and the SDKs' strict types. Errors found
before ACCEPT go in-band in the surface's own shape. Live, with the official SDKs:
test_live_api_queue_position.py."""
import json

import pytest
from django.test import AsyncClient, Client

from tests.web import sse_oracles as oracles
from tests.web.fakes import done_event, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]
SURFACES = {
    "chat": ("/v1/chat/completions", {"messages": MSG}),
    "completions": ("/v1/completions", {"prompt": "Once"}),
    "messages": ("/v1/messages", {"messages": MSG, "max_tokens": 8}),
    "responses": ("/v1/responses", {"input": "hi"}),
}


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)


def waited(*positions, tail=None):
    head = [{"kind": "submitted", "req": "r"}] + [{"kind": "queued", "position": p} for p in positions]
    return head + (tail if tail is not None else [
        {"kind": "accepted", "prompt_tokens": 7, "slot": 0, "reused": 0},
        {"kind": "text", "text": "Hel"}, {"kind": "text", "text": "lo"}, done_event()])


async def open_stream(key, surface):
    route, body = SURFACES[surface]
    r = await AsyncClient().post(route, json.dumps({"model": "tiny", **body, "stream": True}),
                                 content_type="application/json",
                                 headers={"Authorization": f"Bearer {key}", "Accept": "application/json"})
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream", r
    raw = b"".join([chunk async for chunk in r.streaming_content]).decode()
    return r, raw


def check(surface, raw):
    """The surface's oracle and strict SDK types on every event."""
    if surface in ("chat", "completions"):
        marker = "chat.completion.chunk" if surface == "chat" else "text_completion"
        parsed = oracles.check_openai_stream(raw, marker)
        oracles.strict_openai_chunks([p for p in parsed if p["choices"]], marker)
        return parsed
    if surface == "messages":
        events = oracles.check_anthropic_stream(raw)
        oracles.strict_anthropic_events(events)
        return events
    events = oracles.check_responses_stream(raw)
    oracles.strict_responses_events(events)
    return events


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_queued_stream_hears_its_position_before_its_first_token(fake_bridge, alice_key, surface):
    fake_bridge.script(*waited(3, 2, 1))
    r, raw = await open_stream(alice_key, surface)
    assert r["x-colibri-queue-position"] == "3"
    assert "x-colibri-queue-position" in r["Access-Control-Expose-Headers"]
    comments = [line for line in raw.split("\n") if line.startswith(": queued")]
    assert comments == [": queued position=3", ": queued position=2", ": queued position=1"]
    assert raw.index(": queued position=1") < raw.index("Hel")
    events = check(surface, raw)  # nothing lost: the whole answer follows
    if surface == "messages":
        pings = [e for e in events if e["type"] == "ping" and "colibri" in e]
        assert [p["colibri"]["queue_position"] for p in pings] == [3, 2, 1]
        assert raw.index('"queue_position":1') < raw.index("event: message_start")
    if surface == "responses":
        names = [e["type"] for e in events]
        assert names[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert events[0]["response"]["status"] == events[1]["response"]["status"] == "queued"
        assert events[2]["response"]["status"] == "in_progress" and events[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_stream_that_never_waits_has_no_position(fake_bridge, alice_key, surface):
    fake_bridge.script(*waited())
    r, raw = await open_stream(alice_key, surface)
    assert not r.has_header("x-colibri-queue-position") and ": queued" not in raw
    check(surface, raw)


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_context_overflow_found_after_the_wait_is_in_band(fake_bridge, alice_key, surface):
    overflow = {"kind": "error", "code": "CONTEXT_EXCEEDED", "n": 900, "limit": 256, "message": "too long"}
    fake_bridge.script(*waited(1, tail=[overflow]))
    r, raw = await open_stream(alice_key, surface)
    records = oracles.sse_records(raw)
    last = json.loads(records[-1][1])
    if surface in ("chat", "completions"):
        assert "[DONE]" not in raw and len(records) == 1
        param = "prompt" if surface == "completions" else "messages"
        assert last["error"]["code"] == "context_length_exceeded" and last["error"]["param"] == param
        assert last["error"]["type"] == "invalid_request_error" and "256" in last["error"]["message"]
    elif surface == "messages":
        assert records[-1][0] == "error"
        assert last == {"type": "error", "error": {"type": "invalid_request_error", "message": last["error"]["message"]}}
        assert "256" in last["error"]["message"]
    else:
        events = [json.loads(d) for _, d in records]
        assert [e["type"] for e in events] == ["response.created", "response.queued", "response.failed"]
        assert [e["sequence_number"] for e in events] == [0, 1, 2]
        oracles.strict_responses_events(events)
        assert last["response"]["error"]["code"] == "invalid_prompt" and last["response"]["output"] == []


@pytest.mark.parametrize("surface", ["chat", "messages", "responses"])
async def test_the_queue_wait_stays_bounded_after_the_stream_started(fake_bridge, alice_key, settings, surface):
    settings.API_QUEUE_TIMEOUT = 0.3
    fake_bridge.script(*waited(2, tail=["hang"]))
    r, raw = await open_stream(alice_key, surface)
    assert r["x-colibri-queue-position"] == "2"
    last = json.loads(oracles.sse_records(raw)[-1][1])
    if surface == "chat":
        assert last["error"]["code"] == "queue_timeout" and last["error"]["type"] == "rate_limit_error"
    elif surface == "messages":
        assert last["error"]["type"] == "rate_limit_error"
    else:
        assert last["type"] == "response.failed" and last["response"]["error"]["code"] == "rate_limit_exceeded"
    assert len(fake_bridge.cancelled) == 1  # the waiting job was cancelled, not left in the queue


def test_a_buffered_request_still_waits_for_accept(fake_bridge, alice_key):
    """No early 200 without a stream: an overflow after the wait is still a clean 400."""
    overflow = {"kind": "error", "code": "CONTEXT_EXCEEDED", "n": 900, "limit": 256, "message": "too long"}
    fake_bridge.script(*waited(2, tail=[overflow]))
    r = Client().post("/v1/chat/completions", json.dumps({"model": "tiny", "messages": MSG}),
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    fake_bridge.scripts.clear()
    fake_bridge.script(*waited(2))
    r = Client().post("/v1/chat/completions", json.dumps({"model": "tiny", "messages": MSG}),
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello"
    assert not r.has_header("x-colibri-queue-position")
