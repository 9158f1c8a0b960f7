"""Per-key and per-user limits (requests and tokens per minute, set in the admin), enforced in
Redis (shared by every web process): 429 in the surface's envelope with Retry-After and the
rate-limit headers of the surface's family, nothing reaches the bridge. Tokens are a bucket that
refills over a sliding minute: a request's prompt estimate + output budget is charged at
admission and settled against its usage at the end (api/limits.py)."""
import asyncio
import json
import uuid
from types import SimpleNamespace

import pytest
import redis
from django.test import Client

from api import limits
from api.models import ApiKey, UserApiLimit
from tests.support import procs
from tests.web.fakes import reply, serve_state

pytestmark = pytest.mark.django_db
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def redis_url():
    url = procs.claim_redis_db()
    yield url
    redis.Redis.from_url(url).flushdb()
    procs.release_redis_db(url)


@pytest.fixture(autouse=True)
def served_up(monkeypatch, settings, redis_url):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url,
                                   "KEY_PREFIX": f"limits-{uuid.uuid4().hex[:8]}"}}
    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})


def post(key, route="/v1/chat/completions", **body):
    payload = {"model": "tiny", **({"prompt": "x"} if route == "/v1/completions" else {"messages": MSG}), **body}
    return Client().post(route, json.dumps(payload), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


# --- requests per minute ------------------------------------------------------------------------

def test_a_key_request_limit_answers_429_with_retry_after(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    ApiKey.objects.update(requests_per_minute=2)
    first = post(alice_key)
    assert first.status_code == 200 and first["x-ratelimit-limit-requests"] == "2"
    assert first["x-ratelimit-remaining-requests"] == "1" and first["x-ratelimit-reset-requests"].endswith("s")
    assert post(alice_key).status_code == 200
    r = post(alice_key)
    assert r.status_code == 429 and int(r["Retry-After"]) >= 1 and r["x-ratelimit-remaining-requests"] == "0"
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = post(alice_key, "/v1/messages")
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error" and r.json()["type"] == "error"
    assert r["anthropic-ratelimit-requests-limit"] == "2" and r["anthropic-ratelimit-requests-remaining"] == "0"
    assert r["anthropic-ratelimit-requests-reset"].endswith("Z") and "x-ratelimit-limit-requests" not in r
    assert len(fake_bridge.requests) == 2


def test_a_user_limit_spans_the_users_keys(fake_bridge, alice, alice_key):
    fake_bridge.script(*reply("ok"))
    UserApiLimit.objects.create(user=alice, requests_per_minute=1)
    other = ApiKey.issue(user=alice, name="second")[1]
    assert post(alice_key).status_code == 200
    assert post(other).status_code == 429


def test_no_limit_set_means_unlimited_and_no_headers(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    responses = [post(alice_key) for _ in range(5)]
    assert all(r.status_code == 200 for r in responses)
    assert not any(h.startswith("x-ratelimit") for h in responses[0].headers)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["colibri_base.cache.SharedPoolRedisCache",  # on the loop
                                     "django.core.cache.backends.redis.RedisCache"])  # in threads
async def test_concurrent_requests_cannot_pass_a_request_limit_together(settings, backend):
    """The request log is read and written by one atomic script: 12 requests at once on a limit
    of 5 admit exactly 5 (a read-then-write log admits every request that reads before the
    others write)."""
    settings.CACHES = {"default": {**settings.CACHES["default"], "BACKEND": backend}}
    key = SimpleNamespace(requests_per_minute=5, prefix=uuid.uuid4().hex[:8])
    user = SimpleNamespace(pk=1, date_joined=SimpleNamespace(timestamp=lambda: 0.0))
    request = SimpleNamespace(auth=key, user=user, _api_user_limits=None)
    verdicts = await asyncio.gather(*(limits.KeyRequestThrottle().allow_request(request, None) for _ in range(12)))
    assert sorted(verdicts) == [False] * 7 + [True] * 5
    refused = limits.KeyRequestThrottle()
    assert await refused.allow_request(request, None) is False and 0 < refused.wait() <= 60
    assert request._api_ratelimit["requests"][:2] == (5, 0)


# --- tokens per minute: the bucket itself (api.limits, against Redis, with a chosen clock) --------

ACCOUNT = [("key", "k1", 600)]  # 600 tokens a minute: 10 a second


def test_the_charge_is_taken_at_admission_so_concurrent_requests_cannot_overshoot():
    t = 1000.0
    a = limits.tokens_admit(ACCOUNT, 400, now=t)
    assert a.info() == (600, 200, 40.0)
    with pytest.raises(limits.TokenLimitExceeded) as exc:  # a second one, still running: 200 left
        limits.tokens_admit(ACCOUNT, 400, now=t)
    assert exc.value.wait == pytest.approx(20.0) and exc.value.info[:2] == (600, 200)
    b = limits.tokens_admit(ACCOUNT, 150, now=t)  # fits
    assert b.info()[1] == 50
    # The first used only 100 of its 400: the rest returns at the end.
    a.settle(100, now=t)
    assert limits.tokens_admit(ACCOUNT, 300, now=t).info()[1] == 50


def test_the_window_slides_instead_of_resetting_on_the_minute():
    t = 2000.0
    limits.tokens_admit(ACCOUNT, 600, now=t)
    with pytest.raises(limits.TokenLimitExceeded):
        limits.tokens_admit(ACCOUNT, 100, now=t + 9)  # 90 back after 9 s
    limits.tokens_admit(ACCOUNT, 100, now=t + 10)     # 100 back after 10 s
    with pytest.raises(limits.TokenLimitExceeded) as exc:
        limits.tokens_admit(ACCOUNT, 600, now=t + 10)
    assert exc.value.wait == pytest.approx(60.0)


def test_one_request_cannot_overshoot_for_free():
    """A charge above the limit waits for a full bucket; what it used beyond is owed."""
    t = 3000.0
    big = limits.tokens_admit(ACCOUNT, 5000, now=t)  # capped at 600, admitted on a full bucket
    assert big.info()[1] == 0
    big.settle(900, now=t)  # it used 900: 300 owed
    with pytest.raises(limits.TokenLimitExceeded) as exc:
        limits.tokens_admit(ACCOUNT, 10, now=t + 30)  # 300 refilled only pays the debt back
    assert exc.value.wait == pytest.approx(1.0)
    limits.tokens_admit(ACCOUNT, 10, now=t + 31)


def test_every_account_must_hold_the_charge_and_a_refusal_charges_none():
    t = 4000.0
    both = [("key", "k2", 1000), ("user", "u2", 300)]
    limits.tokens_admit(both, 250, now=t)  # key 750 left, user 50
    with pytest.raises(limits.TokenLimitExceeded) as exc:
        limits.tokens_admit(both, 100, now=t)
    assert exc.value.info[0] == 300 and exc.value.wait == pytest.approx(10.0)
    assert limits.tokens_admit([("key", "k2", 1000)], 750, now=t).info()[1] == 0  # the key kept its 750


def test_settling_twice_counts_once():
    t = 5000.0
    r = limits.tokens_admit(ACCOUNT, 300, now=t)
    r.settle(0, now=t)
    r.settle(0, now=t)
    assert limits.tokens_admit(ACCOUNT, 600, now=t).info()[1] == 0


# --- tokens per minute through the surfaces --------------------------------------------------------

def test_a_token_limit_charges_the_budget_first_and_refunds_the_unused(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok", prompt_tokens=7, completion_tokens=2))
    ApiKey.objects.update(tokens_per_minute=100)
    r = post(alice_key, max_tokens=50)  # charged the prompt estimate + 50, settled at 9 used
    assert r.status_code == 200 and r["x-ratelimit-limit-tokens"] == "100"
    estimate = 100 - int(r["x-ratelimit-remaining-tokens"]) - 50  # the rendered prompt's ~bytes/4
    assert 0 < estimate < 30
    # 91 left after the settlement: this one fits only because the unused budget came back.
    assert post(alice_key, max_tokens=90 - estimate).status_code == 200
    r = post(alice_key, max_tokens=95)
    assert r.status_code == 429 and int(r["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and "tokens per minute" in r.json()["error"]["message"]
    assert r["x-ratelimit-limit-tokens"] == "100" and r["x-ratelimit-reset-tokens"].endswith("s")
    assert len(fake_bridge.requests) == 2


def test_anthropic_clients_get_their_headers_and_envelope(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok", prompt_tokens=7, completion_tokens=2))
    ApiKey.objects.update(tokens_per_minute=50)
    ok = post(alice_key, "/v1/messages", max_tokens=40)
    assert ok.status_code == 200 and ok["anthropic-ratelimit-tokens-limit"] == "50"
    r = post(alice_key, "/v1/messages", max_tokens=49)
    assert r.status_code == 429 and r.json() == {"type": "error", "error": {"type": "rate_limit_error",
                                                                            "message": r.json()["error"]["message"]}}
    assert int(r["Retry-After"]) >= 1 and int(r["retry-after-ms"]) >= 1000
    assert r["anthropic-ratelimit-tokens-remaining"] and r["anthropic-ratelimit-tokens-reset"].endswith("Z")


def test_a_request_the_engine_refuses_gets_its_tokens_back(fake_bridge, alice_key):
    fake_bridge.script({"kind": "submitted", "req": "r"}, {"kind": "error", "code": "QUEUE_FULL", "retry_after": 1})
    ApiKey.objects.update(tokens_per_minute=100)
    assert post(alice_key, max_tokens=90).status_code == 429  # queue full: nothing was used
    fake_bridge.scripts.clear()
    fake_bridge.script(*reply("ok"))
    assert post(alice_key, max_tokens=90).status_code == 200


def test_without_max_tokens_the_served_budget_is_charged_up_to_the_limit(fake_bridge, alice_key, settings):
    # 600 used: the bucket refills 1000/60 a second, so it is 36 s from full whatever the host's speed
    # (with 9 used it was full again 0.54 s later, which a slow CI host reached: stop 30)
    fake_bridge.script(*reply("ok", prompt_tokens=500, completion_tokens=100))
    ApiKey.objects.update(tokens_per_minute=1000)
    assert post(alice_key).status_code == 200  # charged min(prompt + context, 1000): a full bucket
    assert len(fake_bridge.requests) == 1 and fake_bridge.requests[0].max_tokens == settings.ENGINE_CTX
    r = post(alice_key)  # the first came back to 1000 - 600: not a full bucket
    assert r.status_code == 429 and 30 <= int(r["Retry-After"]) <= 36
