"""`"colibri": {"routing": true}` (issue 13 item 4) on the four surfaces, with a scripted bridge:
the request asks the bridge for routes, the answer carries the summary in its `colibri` object
(buffered) and in the final event or chunk (streaming), every object still passes the SDKs'
strict types; off by default; refused with 400 naming the field on an engine without our
extensions, and the bridge's own refusal is a 400 too. Live: test_live_api_routing.py."""
import json

import pytest
from django.test import AsyncClient, Client

from tests.web import sse_oracles as oracles
from tests.web.fakes import done_event, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]
ROUTING = {"rows": 4, "cols": 8, "counts": [[0, 1, 3], [0, 5, 2], [3, 7, 5]]}
SURFACES = {
    "chat": ("/v1/chat/completions", {"messages": MSG}),
    "completions": ("/v1/completions", {"prompt": "Once"}),
    "messages": ("/v1/messages", {"messages": MSG, "max_tokens": 8}),
    "responses": ("/v1/responses", {"input": "hi"}),
}


@pytest.fixture
def state(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


def events(routing=ROUTING):
    return [{"kind": "submitted", "req": "r"}, {"kind": "accepted", "prompt_tokens": 7, "slot": 0, "reused": 0},
            {"kind": "text", "text": "Hello"}, {**done_event(), "routing": routing}]


def body(surface, routing=True, **extra):
    route, fields = SURFACES[surface]
    return route, {"model": "tiny", **fields, **({"colibri": {"routing": routing}} if routing is not None else {}), **extra}


def post(key, surface, **kw):
    route, data = body(surface, **kw)
    return Client().post(route, json.dumps(data), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def validate(surface, data):
    from anthropic.types import Message
    from openai.types import Completion
    from openai.types.chat import ChatCompletion
    from openai.types.responses import Response

    {"chat": ChatCompletion, "completions": Completion, "messages": Message, "responses": Response}[surface].model_validate(data)


@pytest.mark.parametrize("surface", SURFACES)
def test_buffered_answers_carry_the_routing(fake_bridge, state, alice_key, surface):
    fake_bridge.script(*events())
    r = post(alice_key, surface)
    assert r.status_code == 200, r.content
    data = r.json()
    validate(surface, data)
    assert data["colibri"]["routing"] == ROUTING
    assert fake_bridge.requests[0].routes is True


@pytest.mark.parametrize("surface", SURFACES)
async def test_streams_carry_it_in_their_final_event(fake_bridge, state, alice_key, surface):
    fake_bridge.script(*events())
    route, data = body(surface, stream=True)
    r = await AsyncClient().post(route, json.dumps(data), content_type="application/json",
                                 headers={"Authorization": f"Bearer {alice_key}"})
    assert r.status_code == 200
    raw = b"".join([c async for c in r.streaming_content]).decode()
    if surface in ("chat", "completions"):
        marker = "chat.completion.chunk" if surface == "chat" else "text_completion"
        parsed = oracles.check_openai_stream(raw, marker)
        oracles.strict_openai_chunks(parsed, marker)
        final = parsed[-1]
        assert final["choices"] == [] and final["colibri"]["routing"] == ROUTING
    elif surface == "messages":
        parsed = oracles.check_anthropic_stream(raw)
        oracles.strict_anthropic_events(parsed)
        assert parsed[-1]["type"] == "message_stop" and parsed[-1]["colibri"] == {"routing": ROUTING}
    else:
        parsed = oracles.check_responses_stream(raw)
        oracles.strict_responses_events(parsed)
        assert parsed[-1]["type"] == "response.completed" and parsed[-1]["response"]["colibri"] == {"routing": ROUTING}
        assert all("colibri" not in e.get("response", {}) for e in parsed[:-1])


@pytest.mark.parametrize("surface", SURFACES)
def test_off_by_default(fake_bridge, state, alice_key, surface):
    fake_bridge.script(*events(routing=None))
    data = post(alice_key, surface, routing=None).json()
    assert fake_bridge.requests[0].routes is False
    if surface in ("chat", "completions"):
        assert data["colibri"]["routing"] is None  # their colibri object has always been there
    else:
        assert "colibri" not in data


@pytest.mark.parametrize("surface", SURFACES)
def test_an_engine_without_extensions_refuses_it_by_name(fake_bridge, state, alice_key, surface):
    state["model"] = {"name": "tiny", "file": "/models/tiny.gguf", "extensions": False}
    fake_bridge.script(*events())
    r = post(alice_key, surface)
    assert r.status_code == 400 and fake_bridge.requests == []
    err = r.json()["error"]
    assert "colibri.routing" in err["message"]
    if surface == "messages":
        assert err["type"] == "invalid_request_error" and r.json()["type"] == "error"
    else:
        assert err["param"] == "colibri.routing"


def test_the_bridges_refusal_is_a_400_too(fake_bridge, state, alice_key):
    fake_bridge.script({"kind": "submitted", "req": "r"},
                       {"kind": "error", "code": "BAD_REQUEST", "message": "routes is not supported by this engine"})
    r = post(alice_key, "chat")
    assert r.status_code == 400 and "routes is not supported" in r.json()["error"]["message"]


def test_not_a_boolean(fake_bridge, state, alice_key):
    r = post(alice_key, "responses", routing="yes")
    assert r.status_code == 400 and r.json()["error"]["param"] == "colibri.routing"
