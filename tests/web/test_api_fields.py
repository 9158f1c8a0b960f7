"""The request fields SDKs send (issue 25 item 4) with a scripted bridge: `n` (independent
choices, each its own index, finish and seed; usage once), `logprobs` / `top_logprobs` on Chat
and Completions' integer `logprobs` (the OpenAI shapes, buffered and streamed, from the bridge's
per-token entries), `top_k` on every surface (our engine's key), their bounds and refusals.
Against the real engine with the official SDKs: test_live_api_fields.py."""
import json

import pytest
from django.test import AsyncClient, Client

from tests.web import sse_oracles as oracles
from tests.web.fakes import done_event, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


def entry(token, lp=-0.5):
    return {"token": token, "logprob": lp, "bytes": list(token.encode()),
            "top": [{"token": token, "logprob": lp, "bytes": list(token.encode())},
                    {"token": "zz", "logprob": -3.0, "bytes": [122, 122]},
                    {"token": "y", "logprob": -4.0, "bytes": [121]}]}


def script(*texts, finish_reason="stop", completion_tokens=None, logprobs=False):
    events = [{"kind": "submitted", "req": "r"}, {"kind": "accepted", "prompt_tokens": 7, "slot": 0, "reused": 0}]
    for t in texts:
        events.append({"kind": "text", "text": t, **({"logprobs": [entry(t)]} if logprobs else {})})
    return events + [done_event(completion_tokens=completion_tokens or len(texts), finish_reason=finish_reason)]


def post(key, route, data):
    return Client().post(route, json.dumps(data), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


async def stream(key, route, data):
    r = await AsyncClient().post(route, json.dumps({**data, "stream": True}), content_type="application/json",
                                 headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r
    return b"".join([chunk async for chunk in r.streaming_content]).decode()


def test_n_choices_buffered_each_with_its_index_finish_and_seed(fake_bridge, alice_key):
    from openai.types.chat import ChatCompletion

    fake_bridge.script(*script("a", "b"))
    fake_bridge.script(*script("c", finish_reason="length"))
    fake_bridge.script(*script("d", "e", "f"))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "n": 3, "seed": 40})
    assert r.status_code == 200, r.content
    data = r.json()
    ChatCompletion.model_validate(data)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in data["choices"]] == ["ab", "c", "def"]
    assert [c["finish_reason"] for c in data["choices"]] == ["stop", "length", "stop"]
    assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 6, "total_tokens": 13}
    assert [q.seed for q in fake_bridge.requests] == [40, 41, 42]


async def test_n_choices_streamed_carry_their_index_and_one_usage(fake_bridge, alice_key):
    fake_bridge.script(*script("a", "b"))
    fake_bridge.script(*script("c"))
    raw = await stream(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "n": 2,
                                                         "stream_options": {"include_usage": True}})
    parsed = oracles.check_openai_stream(raw, "chat.completion.chunk")
    oracles.strict_openai_chunks(parsed, "chat.completion.chunk")
    text = {0: "", 1: ""}
    finishes = {}
    for p in parsed:
        for c in p["choices"]:
            text[c["index"]] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finishes[c["index"]] = c["finish_reason"]
    assert text == {0: "ab", 1: "c"} and finishes == {0: "stop", 1: "stop"}
    usages = [p["usage"] for p in parsed if p.get("usage")]
    assert usages == [{"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}]
    assert raw.count("[DONE]") == 1 and len({p["id"] for p in parsed}) == 1


def test_completions_n(fake_bridge, alice_key):
    from openai.types import Completion

    fake_bridge.script(*script("x"))
    fake_bridge.script(*script("y"))
    data = post(alice_key, "/v1/completions", {"model": "tiny", "prompt": "p", "n": 2}).json()
    Completion.model_validate(data)
    assert [(c["index"], c["text"]) for c in data["choices"]] == [(0, "x"), (1, "y")]


def test_chat_logprobs_buffered(fake_bridge, alice_key):
    from openai.types.chat import ChatCompletion

    fake_bridge.script(*script("He", "llo", logprobs=True))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "logprobs": True, "top_logprobs": 2})
    data = r.json()
    ChatCompletion.model_validate(data)
    content = data["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["He", "llo"] and content[0]["bytes"] == [72, 101]
    assert [len(c["top_logprobs"]) for c in content] == [2, 2]
    assert content[0]["top_logprobs"][1] == {"token": "zz", "logprob": -3.0, "bytes": [122, 122]}
    assert fake_bridge.requests[0].logprobs == 2
    # logprobs without top_logprobs: the tokens' own logprobs, no candidates (engine asked for 1)
    data = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "logprobs": True}).json()
    assert all(c["top_logprobs"] == [] for c in data["choices"][0]["logprobs"]["content"])
    assert fake_bridge.requests[1].logprobs == 1
    # off: null, and nothing asked of the engine
    data = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG}).json()
    assert data["choices"][0]["logprobs"] is None and fake_bridge.requests[2].logprobs == 0


async def test_chat_logprobs_streamed(fake_bridge, alice_key):
    from openai.types.chat import ChatCompletionChunk

    fake_bridge.script(*script("He", "llo", logprobs=True))
    raw = await stream(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "logprobs": True,
                                                         "top_logprobs": 3})
    parsed = oracles.check_openai_stream(raw, "chat.completion.chunk")
    tokens = []
    for p in parsed:
        ChatCompletionChunk.model_validate(p)
        for c in p["choices"]:
            if c["delta"].get("content"):
                assert c["logprobs"]["content"], c
                tokens += [e["token"] for e in c["logprobs"]["content"]]
    assert tokens == ["He", "llo"]


async def test_completion_logprobs_buffered_and_streamed(fake_bridge, alice_key):
    from openai.types import Completion

    fake_bridge.script(*script("He", "llo", logprobs=True))
    data = (await AsyncClient().post("/v1/completions", json.dumps({"model": "tiny", "prompt": "p", "logprobs": 2}),
                                     content_type="application/json",
                                     headers={"Authorization": f"Bearer {alice_key}"})).json()
    Completion.model_validate(data)
    lp = data["choices"][0]["logprobs"]
    assert lp["tokens"] == ["He", "llo"] and lp["token_logprobs"] == [-0.5, -0.5]
    assert lp["top_logprobs"] == [{"He": -0.5, "zz": -3.0}, {"llo": -0.5, "zz": -3.0}] and lp["text_offset"] == [0, 2]
    raw = await stream(alice_key, "/v1/completions", {"model": "tiny", "prompt": "p", "logprobs": 1})
    parsed = [p for p in oracles.check_openai_stream(raw, "text_completion") if p["choices"]]
    offsets = [o for p in parsed if p["choices"][0]["logprobs"] for o in p["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 2]


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "p"}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 4}), ("/v1/responses", {"input": "hi"})])
def test_top_k_reaches_the_engine_on_every_surface(fake_bridge, alice_key, route, body):
    fake_bridge.script(*script("ok"))
    r = post(alice_key, route, {"model": "tiny", **body, "top_k": 5})
    assert r.status_code == 200, r.content
    assert fake_bridge.requests[0].top_k == 5


@pytest.mark.parametrize("route,patch,param", [
    ("/v1/chat/completions", {"n": 9}, "n"), ("/v1/chat/completions", {"n": 0}, "n"),
    ("/v1/completions", {"n": True}, "n"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/chat/completions", {"top_k": -1}, "top_k"), ("/v1/responses", {"top_k": 1.5}, "top_k"),
])
def test_bounds_name_the_field(fake_bridge, alice_key, route, patch, param):
    base = {"/v1/completions": {"prompt": "p"}, "/v1/responses": {"input": "hi"}}.get(route, {"messages": MSG})
    r = post(alice_key, route, {"model": "tiny", **base, **patch})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.content
    assert not fake_bridge.requests


@pytest.mark.parametrize("patch,param", [({"logprobs": True}, "logprobs"), ({"top_k": 3}, "top_k")])
def test_an_engine_without_our_extensions_refuses_them_by_name(fake_bridge, alice_key, served_up, patch, param):
    served_up["model"] = {"name": "glm", "file": "/m/glm", "extensions": False}
    r = post(alice_key, "/v1/chat/completions", {"model": "glm", "messages": MSG, **patch})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.content


def test_user_and_metadata_are_accepted(fake_bridge, alice_key):
    fake_bridge.script(*script("ok"))
    assert post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "user": "u1",
                                                    "metadata": {"k": "v"}}).status_code == 200
    assert post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 4,
                                            "metadata": {"user_id": "u1"}}).status_code == 200


def test_count_tokens_counts_system_tools_and_messages_with_the_template(fake_bridge, alice_key):
    from anthropic.types import MessageTokensCount

    fake_bridge.script({"kind": "submitted", "req": "r"}, {"kind": "accepted", "prompt_tokens": 31, "slot": 0}, "hang")
    tool = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {}}}
    r = post(alice_key, "/v1/messages/count_tokens", {"model": "tiny", "system": [{"type": "text", "text": "Be brief."}],
                                                      "tools": [tool],
                                                      "messages": [{"role": "user", "content": [
                                                          {"type": "text", "text": "one "}, {"type": "text", "text": "two"}]}]})
    assert r.status_code == 200, r.content
    MessageTokensCount.model_validate(r.json())
    assert r.json() == {"input_tokens": 31}
    prompt = fake_bridge.requests[0].prompt
    assert "Be brief." in prompt and '"name": "get_weather"' in prompt and "one two" in prompt
    assert prompt.endswith("<|im_start|>assistant\n") and fake_bridge.cancelled  # counted, then cancelled


@pytest.mark.parametrize("patch", [{"tools": [{"description": "no name"}]}, {"messages": []}, {"model": 3}])
def test_count_tokens_refusals_use_the_anthropic_envelope(fake_bridge, alice_key, patch):
    r = post(alice_key, "/v1/messages/count_tokens", {"model": "tiny", "messages": MSG, **patch})
    assert r.status_code == 400 and r.json()["type"] == "error", r.content
    assert r.json()["error"]["type"] == "invalid_request_error" and not fake_bridge.requests


@pytest.mark.parametrize("route,body,field,stops", [
    ("/v1/messages", {"messages": MSG, "max_tokens": 4}, "stop_sequences", ["x" * 1000] * 1000),
    ("/v1/messages", {"messages": MSG, "max_tokens": 4}, "stop_sequences", ["x" * 3000] * 300),
    ("/v1/messages", {"messages": MSG, "max_tokens": 4}, "stop_sequences", ["s"] * 33),
    ("/v1/messages", {"messages": MSG, "max_tokens": 4}, "stop_sequences", ["x" * 257]),
    ("/v1/chat/completions", {"messages": MSG}, "stop", ["x" * 257]),
    ("/v1/chat/completions", {"messages": MSG}, "stop", ["a"] * 5),
    ("/v1/completions", {"prompt": "p"}, "stop", "x" * 300),
])
def test_stop_lists_past_the_bounds_are_400_naming_the_field(fake_bridge, alice_key, route, body, field, stops):
    r = post(alice_key, route, {"model": "tiny", **body, field: stops})
    assert r.status_code == 400, r.content
    err = r.json()["error"]
    assert field in err["message"] and (err.get("param") in (None, field))
    assert not fake_bridge.requests


def test_stop_lists_at_the_bounds_are_accepted(fake_bridge, alice_key):
    from engine_bridge.request import MAX_STOP_CHARS, MAX_STOPS

    fake_bridge.script(*script("ok"))
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 4,
                                         "stop_sequences": [f"{i:03d}" + "x" * (MAX_STOP_CHARS - 3) for i in range(MAX_STOPS)]})
    assert r.status_code == 200, r.content
    assert len(fake_bridge.requests[0].stop) == MAX_STOPS
