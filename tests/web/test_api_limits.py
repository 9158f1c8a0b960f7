"""Per-key and per-user limits (requests and tokens per minute, set in the admin), enforced
through the cache (Redis in production, shared by every web process): 429 in the surface's
envelope with Retry-After, nothing reaches the bridge."""
import json

import pytest
from django.test import Client

from api.models import ApiKey, UserApiLimit
from tests.web.fakes import reply

pytestmark = pytest.mark.django_db
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def served_up(monkeypatch, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "limits"}}
    monkeypatch.setattr("api.served._read_state", lambda: {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})


def post(key, route="/v1/chat/completions", **body):
    payload = {"model": "tiny", **({"prompt": "x"} if route == "/v1/completions" else {"messages": MSG}), **body}
    return Client().post(route, json.dumps(payload), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def test_a_key_request_limit_answers_429_with_retry_after(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    ApiKey.objects.update(requests_per_minute=2)
    assert [post(alice_key).status_code for _ in range(2)] == [200, 200]
    r = post(alice_key)
    assert r.status_code == 429 and int(r["Retry-After"]) >= 1
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = post(alice_key, "/v1/messages")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" and r.json()["type"] == "error"
    assert len(fake_bridge.requests) == 2


def test_a_user_limit_spans_the_users_keys(fake_bridge, alice, alice_key):
    fake_bridge.script(*reply("ok"))
    UserApiLimit.objects.create(user=alice, requests_per_minute=1)
    other = ApiKey.issue(user=alice, name="second")[1]
    assert post(alice_key).status_code == 200
    assert post(other).status_code == 429


def test_a_token_limit_counts_prompt_and_completion(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok", prompt_tokens=7, completion_tokens=2))
    ApiKey.objects.update(tokens_per_minute=10)
    assert post(alice_key).status_code == 200  # 9 tokens
    assert post(alice_key, "/v1/completions").status_code == 200  # 18: over, but admitted under it
    r = post(alice_key)
    assert r.status_code == 429 and int(r["Retry-After"]) >= 1
    assert len(fake_bridge.requests) == 2


def test_no_limit_set_means_unlimited(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    assert all(post(alice_key).status_code == 200 for _ in range(5))
