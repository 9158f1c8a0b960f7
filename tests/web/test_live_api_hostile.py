"""Hostile bodies against the live stack (Daphne + bridge + engine on the fixture model), issue 10
item 5: the table on every /v1 generation route (0 5xx, the surface's envelope), no Redis
connection left blocked, a subnormal sampling value beside a live stream (the engine survives,
no restart), and a bounded hypothesis fuzz pass over /v1/chat/completions bodies (0 5xx)."""
import json
import math
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from api.models import ApiKey
from tests.support import procs
from tests.web.test_api_hostile import ROUTES, assert_envelope, hostile_bodies

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="hostile")[1]


@pytest.fixture
def model(live_stack, key):
    r = httpx.get(live_stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    return r.json()["data"][0]["id"]


class Resp:
    """httpx response with the attribute names assert_envelope reads (Django's test client's)."""

    def __init__(self, r):
        self.status_code, self.content, self._r = r.status_code, r.content, r

    def json(self):
        return self._r.json()


def test_it_refuses_hostile_bodies_on_every_route(live_stack, key, model):
    blocked_before = procs.blocked_clients(live_stack.redis_url)
    failures, n = [], 0
    with httpx.Client(base_url=live_stack.url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for route in ROUTES:
            for name, raw, status in hostile_bodies(route, model=model):
                raw = raw.encode() if isinstance(raw, str) else raw
                r = http.post(route, content=raw, headers={"Content-Type": "application/json"})
                n += 1
                if r.status_code >= 500:
                    failures.append(f"{route} {name}: {r.status_code} {r.text[:200]}")
                    continue
                try:
                    assert_envelope(route, Resp(r), status)
                except (AssertionError, ValueError, KeyError) as exc:
                    failures.append(f"{route} {name}: {exc!r}"[:300])
        # A chunked body (no Content-Length) over the cap is refused the same way.
        big = json.dumps({"model": model, "prompt": "x" * (5 * 1024 * 1024)}).encode()
        r = http.post("/v1/completions", content=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]))
        n += 1
        if r.status_code != 413 or r.json()["error"]["code"] != "request_too_large":
            failures.append(f"chunked too large: {r.status_code} {r.text[:200]}")
        # Lone surrogates used to leave a Redis connection blocked for 150 s each.
        for _ in range(10):
            raw = json.dumps({"model": model, "messages": [{"role": "user", "content": "x"}]}).replace('"x"', '"\\ud800"')
            assert http.post("/v1/chat/completions", content=raw).status_code == 400
    print(f"\n{n} hostile bodies, {len(failures)} failures")
    assert not failures, failures
    # The defect left one connection blocked per surrogate request (150 s each): +10 here. The
    # bridge's own receive loop may be between two pops at either reading, hence the slack.
    assert procs.blocked_clients(live_stack.redis_url) <= blocked_before + 2


def test_a_subnormal_temperature_beside_a_live_stream_restarts_nothing(live_stack, key, model):
    restarts = live_stack.bridge_state().get("restarts", 0)
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": 3000, "temperature": 0, "stream": True}
    outcome = {}

    def stream():
        with httpx.stream("POST", live_stack.url + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            outcome["lines"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    worker = threading.Thread(target=stream)
    worker.start()
    time.sleep(0.2)
    for field in ("temperature", "top_p"):
        for value in ("1e-320", "2e-308", "5e-324"):
            raw = json.dumps({"model": model, "messages": body["messages"], "max_tokens": 4})[:-1] + f', "{field}": {value}}}'
            r = httpx.post(live_stack.url + "/v1/chat/completions", content=raw, headers=headers, timeout=60)
            assert r.status_code == 200, r.text
    worker.join(60)
    assert outcome["lines"][-1] == "data: [DONE]", outcome["lines"][-3:]
    assert live_stack.bridge_state().get("restarts", 0) == restarts


# --- fuzz ---------------------------------------------------------------------------------------

def _text():
    # Surrogates included (json.dumps escapes them as \udXXX, as a hostile client would send).
    return st.text(st.characters(codec=None, exclude_categories=()), max_size=12)


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), _text(),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e-320, -0.0, 2e-308, 1e308]))
_json = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(_text(), inner, max_size=3)), max_leaves=8)
_message = st.fixed_dictionaries({}, optional={"role": st.one_of(st.sampled_from(["user", "system", "assistant",
                                                                                    "developer", "tool"]), _json),
                                               "content": st.one_of(_text(), _json,
                                                                    st.lists(st.fixed_dictionaries(
                                                                        {"type": st.sampled_from(["text", "image_url", "x"]),
                                                                         "text": _json}), max_size=2))})
# Never omitted nor huge: the default budget is the whole context (seconds of decoding each).
_budget = st.one_of(st.integers(-3, 6), st.floats(-2, 6), st.sampled_from([math.nan, math.inf, -math.inf]),
                    st.booleans(), _text(), st.lists(_scalar, max_size=2))


def _mostly(valid, hostile=_json):
    # Valid values four times in five, so the fuzz also reaches past the first refused field.
    return st.one_of(valid, valid, valid, valid, hostile)


_valid_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "developer"]),
                                                  "content": _mostly(st.text(max_size=12), _text())}),
                           min_size=1, max_size=3)
_bodies = st.fixed_dictionaries(
    {"model": _mostly(st.just("MODEL")), "messages": _mostly(_valid_messages, st.lists(_message, max_size=3) | _json),
     "max_tokens": _mostly(st.integers(0, 6), _budget)},
    optional={"temperature": _mostly(st.floats(0, 2)), "top_p": _mostly(st.floats(0, 1)),
              "stop": _mostly(st.lists(st.text(min_size=1, max_size=4), max_size=4), _text() | _json), "stream": _mostly(st.booleans()),
              "seed": _mostly(st.integers(0, 2**63 - 1)), "n": _mostly(st.just(1)),
              "response_format": _mostly(st.just({"type": "text"})),
              "stream_options": _mostly(st.fixed_dictionaries({"include_usage": st.booleans()})), "logprobs": _mostly(st.just(False)),
              "max_completion_tokens": _mostly(st.integers(0, 6), _budget), "tools": _mostly(st.just([])), "colibri": _mostly(st.just({}))})


@pytest.fixture
def fuzz_client(live_stack, key):
    with httpx.Client(base_url=live_stack.url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as http:
        yield http


def test_fuzzing_chat_completions_finds_no_5xx(live_stack, fuzz_client, model):
    seen = {}
    restarts = live_stack.bridge_state().get("restarts", 0)

    @settings(max_examples=120, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=_bodies)
    # A NUL anywhere (issue 24: PostgreSQL text cannot hold it) is a 400 naming the field, pinned
    # here rather than left to the generator's draw.
    @example(body={"model": "MODEL", "messages": [{"role": "user", "content": "\x00"}], "max_tokens": 2})
    @example(body={"model": "MODEL", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                   "stop": ["\x00"]})
    @example(body={"model": "\x00", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    def check(body):
        if body.get("model") == "MODEL":
            body["model"] = model
        raw = json.dumps(body, allow_nan=True)  # NaN / Infinity literals, as a hostile client sends
        r = fuzz_client.post("/v1/chat/completions", content=raw)
        if body.get("stream") is True and r.status_code == 200:
            r.read()
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (raw[:300], r.text[:300])
        if r.status_code != 200:
            assert {"message", "type", "param", "code"} <= set(r.json()["error"])

    check()
    print(f"\nfuzz statuses: {dict(sorted(seen.items()))}")
    assert live_stack.bridge_state().get("restarts", 0) == restarts
