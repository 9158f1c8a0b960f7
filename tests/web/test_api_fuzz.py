"""A hypothesis pass over the bodies of all four generation routes, in process with a scripted
bridge (fast, so more examples than the live pass in test_live_api_hostile.py): no 5xx, every
refusal in the surface's envelope."""
import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from hypothesis import HealthCheck, example, given, settings, strategies as st

from tests.web.fakes import reply, serve_state
from tests.web.test_live_api_hostile import _budget, _json, _mostly, _text

pytestmark = pytest.mark.django_db
_valid_text = st.text(max_size=8)
_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "image_url", "x"]),
                                         "text": _mostly(_valid_text)}), max_size=2)
_content = _mostly(_valid_text, _parts | _json | _text())


def _msgs(roles):
    return _mostly(st.lists(st.fixed_dictionaries({"role": _mostly(st.sampled_from(roles)), "content": _content}),
                            min_size=1, max_size=3))


_sampling = {"temperature": _mostly(st.floats(0, 2)), "top_p": _mostly(st.floats(0, 1)),
             "stream": _mostly(st.booleans()), "seed": _mostly(st.integers(0, 2**63 - 1))}
ROUTES = {
    "/v1/chat/completions": ({"messages": _msgs(["user", "system", "assistant", "developer", "tool"]),
                              "max_tokens": _mostly(st.integers(0, 6), _budget)},
                             {"stop": _json, "n": _json, "response_format": _json, "stream_options": _json,
                              "max_completion_tokens": _budget, "tools": _json, "tool_choice": _json,
                              "functions": _json, "function_call": _json, "parallel_tool_calls": _json}),
    "/v1/completions": ({"prompt": _mostly(st.text(min_size=1, max_size=8), st.lists(_valid_text, max_size=2) | _json),
                         "max_tokens": _mostly(st.integers(0, 6), _budget)},
                        {"stop": _json, "echo": _json, "suffix": _json, "best_of": _json, "logprobs": _json}),
    "/v1/messages": ({"messages": _msgs(["user", "assistant"]), "max_tokens": _mostly(st.integers(0, 6), _budget)},
                     {"system": _content, "stop_sequences": _json, "top_k": _json, "tools": _json, "tool_choice": _json,
                      "output_format": _json, "output_config": _json, "metadata": _json}),
    "/v1/responses": ({"input": _mostly(_valid_text, st.lists(st.fixed_dictionaries(
                           {"role": _mostly(st.sampled_from(["user", "system"])), "content": _content,
                            "type": _mostly(st.just("message"))}), max_size=2) | _json),
                       "max_output_tokens": _mostly(st.integers(0, 6), _budget)},
                      {"instructions": _mostly(_valid_text), "text": _json, "previous_response_id": _json,
                       "conversation": _json, "tools": _json, "tool_choice": _json}),
}


def _read_stream(response):
    """The whole SSE body. The generation routes stream from an async generator, which the sync
    test client hands over as is: a plain join raised TypeError on the first streamed 200, which
    this derandomized pass reached only once the NUL examples changed its draws (issue 24)."""
    async def drain(content):
        return b"".join([chunk async for chunk in content])

    content = response.streaming_content
    return async_to_sync(drain)(content) if hasattr(content, "__aiter__") else b"".join(content)


NUL_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "a\x00"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "\x00", "max_tokens": 2},
    "/v1/messages": {"messages": [{"role": "user", "content": [{"type": "text", "text": "\x00"}]}], "max_tokens": 2},
    "/v1/responses": {"input": "\x00", "max_output_tokens": 2},
}


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})


@pytest.mark.parametrize("route", ROUTES)
def test_fuzzing_finds_no_5xx(fake_bridge, alice_key, route):
    fake_bridge.script(*reply("Hel", "lo"))
    required, optional = ROUTES[route]
    # Optional hostile fields are mostly null (accepted), so most examples get past them.
    optional = {name: _mostly(st.none(), value) for name, value in optional.items()}
    # The model is hostile one time in five: as _mostly(...), hypothesis's choice among one_of's
    # branches depends on its seed, and one seed gave 85 hostile models in 150 (too few 200s).
    model = st.sampled_from(["tiny"] * 4 + ["hostile"]).flatmap(lambda m: st.just(m) if m == "tiny" else _json)
    bodies = st.fixed_dictionaries({"model": model, **required}, optional={**_sampling, **optional})
    seen = {}

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(body=bodies)
    # NUL in the text, a key and the model (issue 24): a 400 naming it on every route, never a 5xx.
    @example(body={"model": "tiny", **NUL_BODIES[route]})
    @example(body={"model": "tiny", **NUL_BODIES[route], "metadata": {"\x00": "x"}})
    @example(body={"model": "\x00", **NUL_BODIES[route]})
    def check(body):
        raw = json.dumps(body, allow_nan=True)
        r = Client().generic("POST", route, raw, content_type="application/json",
                             HTTP_AUTHORIZATION=f"Bearer {alice_key}")
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        assert r.status_code < 500, (raw[:300], r.content[:300])
        if r.status_code != 200:
            error = r.json()["error"]
            assert set(error) == {"type", "message"} if route == "/v1/messages" else \
                {"message", "type", "param", "code"} <= set(error)
        elif body.get("stream") is True:
            _read_stream(r)

    check()
    print(f"\n{route}: {dict(sorted(seen.items()))}")
    assert seen.get(200, 0) >= 3  # the fuzz also reached the engine side, not only refusals
