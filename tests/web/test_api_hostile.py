"""Hostile bodies on every /v1 generation route (issue 10 item 5), with a scripted bridge: each
gets a 4xx in its surface's envelope naming the field, and nothing reaches the bridge. The same
table runs against a live Daphne in test_live_api_hostile.py."""
import json

import pytest
from django.test import Client

from tests.web.fakes import reply, serve_state

pytestmark = pytest.mark.django_db

ROUTES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "/v1/responses": {"input": "hi"},
}
BUDGET = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens", "/v1/messages": "max_tokens",
          "/v1/responses": "max_output_tokens"}
CONTENT = {"/v1/chat/completions": "messages", "/v1/completions": "prompt", "/v1/messages": "messages",
           "/v1/responses": "input"}


def hostile_bodies(route, model="tiny"):
    """(name, raw body bytes, expected status). Raw text: Python's json.dumps cannot write some."""
    base = {"model": model, **ROUTES[route]}
    raw = json.dumps(base)
    budget = BUDGET[route]

    def with_field(name, literal):
        return raw[:-1] + f', "{name}": {literal}}}'

    lone = '"\\ud800x"'
    nul = '"a\\u0000b"'  # PostgreSQL text cannot hold it: refused naming the field (issue 24)
    content = CONTENT[route]
    if content == "messages":
        nul_content = raw.replace('"content": "hi"', f'"content": {nul}')
        surrogate = raw.replace('"content": "hi"', f'"content": {lone}')
        role = raw.replace('"role": "user"', '"role": ["user"]')
    elif content == "prompt":
        surrogate, role = raw.replace('"prompt": "hi"', f'"prompt": {lone}'), None
        nul_content = raw.replace('"prompt": "hi"', f'"prompt": {nul}')
    else:
        nul_content = raw.replace('"input": "hi"', f'"input": {nul}')
        surrogate = raw.replace('"input": "hi"', f'"input": [{{"role": "user", "content": {lone}}}]')
        role = raw.replace('"input": "hi"', '"input": [{"role": {"r": 1}, "content": "x"}]')
    stop_field = {"/v1/messages": "stop_sequences", "/v1/responses": None}.get(route, "stop")
    cases = [
        ("model list", with_field("model", json.dumps([model])), 400),  # the last duplicate key wins
        ("model object", with_field("model", json.dumps({"id": model})), 400),
        ("budget NaN", with_field(budget, "NaN"), 400),
        ("budget Infinity", with_field(budget, "Infinity"), 400),
        ("budget -Infinity", with_field(budget, "-Infinity"), 400),
        ("temperature NaN", with_field("temperature", "NaN"), 400),
        ("temperature 1e400", with_field("temperature", "1e400"), 400),
        ("temperature -1e-320", with_field("temperature", "-1e-320"), 400),
        ("top_p 1e400", with_field("top_p", "1e400"), 400),
        ("deep nesting", with_field("x", "[" * 5000 + "]" * 5000), 400),
        ("deep nesting 100", with_field("x", "[" * 100 + "]" * 100), 400),
        ("lone surrogate in content", surrogate, 400),
        ("lone surrogate in a key", raw[:-1] + ', "\\udfff": 1}', 400),
        ("NUL in content", nul_content, 400),
        ("NUL in a key", raw[:-1] + ', "\\u0000": 1}', 400),
        ("NUL in metadata", with_field("metadata", '{"note": "\\u0000"}'), 400),
        ("not an object", "[1, 2]", 400),
        ("not json", "{nope", 400),
        ("empty", "", 400),
        ("bad utf-8", b'{"model": "\xff"}', 400),
        ("too large", raw[:-1] + ', "pad": "' + "x" * (4 * 1024 * 1024) + '"}', 413),
    ]
    if role:
        cases.append(("role not a string", role, 400))
    if stop_field:
        cases.append(("lone surrogate in stop", with_field(stop_field, f"[{lone}]"), 400))
        cases.append(("NUL in stop", with_field(stop_field, f"[{nul}]"), 400))
    return cases


def assert_envelope(route, r, status):
    assert r.status_code == status, (r.status_code, r.content[:300])
    data = r.json()
    if route == "/v1/messages":
        assert data["type"] == "error" and set(data["error"]) == {"type", "message"}
    else:
        assert {"message", "type", "param", "code"} <= set(data["error"])
    return data


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


@pytest.mark.parametrize("route", ROUTES)
def test_it_refuses_hostile_bodies_in_the_envelope(fake_bridge, alice_key, route):
    # One test per route (a user per test costs a password hash); the failures name the cases.
    fake_bridge.script(*reply("ok"))
    failures = []
    for name, raw, status in hostile_bodies(route):
        r = Client().generic("POST", route, raw, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {alice_key}")
        try:
            assert_envelope(route, r, status)
        except (AssertionError, ValueError, KeyError) as exc:
            failures.append(f"{name}: {exc!r}"[:300])
    assert not failures, failures
    assert not fake_bridge.requests


@pytest.mark.parametrize("route", ROUTES)
def test_it_names_the_field_with_the_surrogate(fake_bridge, alice_key, route):
    raw = json.dumps({"model": "tiny", **ROUTES[route], "metadata": {"note": "x"}}).replace('"x"', '"\\udc00"')
    r = Client().generic("POST", route, raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    data = assert_envelope(route, r, 400)
    if route != "/v1/messages":
        assert data["error"]["param"] == "metadata.note"


@pytest.mark.parametrize("route", ROUTES)
def test_it_names_the_field_with_the_nul(fake_bridge, alice_key, route):
    raw = json.dumps({"model": "tiny", **ROUTES[route], "metadata": {"note": "a\x00b"}})
    r = Client().generic("POST", route, raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    data = assert_envelope(route, r, 400)
    assert "NUL" in data["error"]["message"], data
    if route != "/v1/messages":
        assert data["error"]["param"] == "metadata.note"
    assert not fake_bridge.requests


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_subnormal_sampling_values_reach_the_bridge_as_canonical_numbers(fake_bridge, alice_key, route, field):
    fake_bridge.script(*reply("ok"))
    data = {"model": "tiny", **ROUTES[route], field: 1e-320}
    r = Client().post(route, json.dumps(data), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 200, r.content
    sent = getattr(fake_bridge.requests[0], field)
    assert sent == (0.0 if field == "temperature" else 1e-6)


@pytest.mark.parametrize("route", ROUTES)
def test_huge_budgets_clamp_and_fractions_truncate(fake_bridge, alice_key, route, settings):
    fake_bridge.script(*reply("ok"))
    for value, expected in ((10**400, settings.ENGINE_CTX), ("1e400", settings.ENGINE_CTX), (3.9, 3)):
        raw = json.dumps({"model": "tiny", **ROUTES[route]})[:-1] + f', "{BUDGET[route]}": {value}}}'
        r = Client().generic("POST", route, raw, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
        assert r.status_code == 200, r.content
        assert fake_bridge.requests[-1].max_tokens == expected
