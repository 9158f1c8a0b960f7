"""POST /v1/chat/completions and GET /v1/models with a scripted bridge (wire shapes, errors,
DRF pitfalls). The same surface against the real engine is in test_live_api.py."""
import asyncio
import json

import pytest
from django.test import AsyncClient, Client

from tests.web.fakes import reply, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/v1/chat/completions"


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    """The engine is up and its MODEL line names "tiny" (one telemetry read per request)."""
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


def body(**kw):
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **kw}


def post(client, key, data, **headers):
    raw = data if isinstance(data, (str, bytes)) else json.dumps(data)
    headers.setdefault("content_type", "application/json")
    return client.post(URL, raw, HTTP_AUTHORIZATION=f"Bearer {key}", **headers)


def parse_sse(raw):
    records = [r for r in raw.replace("\r\n", "\n").split("\n\n") if r.strip()]
    return [r[len("data: "):] for r in records if r.startswith("data: ")], records


async def stream_text(response):
    return b"".join([chunk async for chunk in response.streaming_content]).decode()


def test_it_requires_a_key(fake_bridge):
    r = Client().post(URL, json.dumps(body()), content_type="application/json")
    assert r.status_code == 401
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_it_rejects_a_bad_key(fake_bridge, alice_key):
    r = post(Client(), alice_key + "x", body())
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_it_rejects_a_revoked_key(fake_bridge, alice_key):
    from api.models import ApiKey

    ApiKey.objects.update(revoked=True)
    assert post(Client(), alice_key, body()).status_code == 401


def test_it_accepts_x_api_key(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    r = Client().post(URL, json.dumps(body()), content_type="application/json", HTTP_X_API_KEY=alice_key)
    assert r.status_code == 200


def test_it_lists_models(fake_bridge, alice_key):
    r = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 200
    page = r.json()
    item = page["data"][0]
    # A typeable slug id (the model file's stem); the MODEL line's name is the display name.
    assert {"id", "object", "created", "owned_by", "type", "display_name", "created_at"} <= set(item)
    assert item["id"] == "smollm2-135m-moe16" and item["display_name"] == "tiny"
    assert page["has_more"] is False and page["first_id"] == page["last_id"] == item["id"]
    assert Client().get("/v1/models/tiny", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()["id"] == item["id"]
    assert Client().get("/v1/models/nope", HTTP_AUTHORIZATION=f"Bearer {alice_key}").status_code == 404


def test_it_answers_buffered(fake_bridge, alice_key):
    fake_bridge.script(*reply("Hel", "lo", completion_tokens=2, finish_reason="length"))
    r = post(Client(), alice_key, body(max_tokens=2, temperature=0))
    assert r.status_code == 200, r.content
    data = r.json()
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert data["choices"][0]["message"] == {"role": "assistant", "content": "Hello", "refusal": None}
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert data["colibri"]["stats"]["tok_s"] == 42.0
    req = fake_bridge.requests[0]
    assert req.max_tokens == 2 and req.conversation_key is None and req.prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("patch,param,status", [
    ({"messages": None}, "messages", 400),
    ({"temperature": 3}, "temperature", 400),
    ({"top_p": 0}, "top_p", 400),
    ({"max_tokens": -1}, "max_tokens", 400),
    ({"max_completion_tokens": "10"}, "max_completion_tokens", 400),
    ({"n": 9}, "n", 400),
    ({"seed": -1}, "seed", 400),
    ({"seed": "7"}, "seed", 400),
    ({"stop": ["a", ""]}, "stop", 400),
    ({"response_format": {"type": "json_object"}}, "response_format", 400),
    ({"stream": "yes"}, "stream", 400),
    ({"model": "gpt-9"}, "model", 404),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0].content[0]", 400),
])
def test_it_names_the_bad_field(fake_bridge, alice_key, patch, param, status):
    data = {k: v for k, v in {**body(), **patch}.items() if v is not None}
    r = post(Client(), alice_key, data)
    assert r.status_code == status, r.content
    assert r.json()["error"]["param"] == param
    assert not fake_bridge.requests


def test_it_rejects_invalid_json(fake_bridge, alice_key):
    r = post(Client(), alice_key, "{nope")
    assert r.status_code == 400 and r.json()["error"]["message"] == "invalid JSON request"


def test_it_reads_json_whatever_the_content_type(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    # curl -d sends application/x-www-form-urlencoded; DRF would parse a form with one key.
    r = post(Client(), alice_key, body(), content_type="application/x-www-form-urlencoded")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    r = Client().generic("POST", URL, json.dumps(body()), content_type="", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 200


def test_it_maps_context_exceeded_to_400(fake_bridge, alice_key):
    fake_bridge.script({"kind": "submitted", "req": "r"}, {"kind": "error", "code": "CONTEXT_EXCEEDED", "message": "", "n": 600, "limit": 510})
    r = post(Client(), alice_key, body(stream=True))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages" and "510" in err["message"]


@pytest.mark.parametrize("code,status", [("ENGINE_UNAVAILABLE", 503), ("QUEUE_FULL", 429), ("ENGINE_DIED", 500)])
def test_it_maps_engine_errors(fake_bridge, alice_key, code, status):
    fake_bridge.script({"kind": "error", "code": code, "message": "boom"})
    r = post(Client(), alice_key, body())
    assert r.status_code == status and r.json()["error"]["type"] in ("server_error", "rate_limit_error")


async def test_it_streams_chunks_usage_and_the_colibri_frame(fake_bridge, alice_key):
    fake_bridge.script(*reply("Hel", "lo"))
    # SDKs send Accept: application/json, browsers/curl text/event-stream: neither may 406.
    r = await AsyncClient().post(URL, json.dumps(body(stream=True, stream_options={"include_usage": True})),
                                 content_type="application/json",
                                 headers={"Authorization": f"Bearer {alice_key}", "Accept": "text/event-stream"})
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream"
    data, _ = parse_sse(await stream_text(r))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Hello"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert chunks[-2]["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert set(chunks[-1]["colibri"]) == {"stats", "perf", "topk", "entropy", "gpus", "repin", "routing"}


async def test_it_sends_an_in_band_error_after_the_stream_started(fake_bridge, alice_key):
    fake_bridge.script(*reply("Hel")[:4], {"kind": "error", "code": "ENGINE_DIED", "message": "exit"})
    r = await AsyncClient().post(URL, json.dumps(body(stream=True)), content_type="application/json",
                                 headers={"Authorization": f"Bearer {alice_key}"})
    data, _ = parse_sse(await stream_text(r))
    assert "[DONE]" not in data
    assert json.loads(data[-1])["error"]["type"] == "server_error"


async def test_leaving_the_stream_cancels_the_engine_request(fake_bridge, alice_key):
    fake_bridge.script(*reply("Hel")[:4], "hang")
    r = await AsyncClient().post(URL, json.dumps(body(stream=True)), content_type="application/json",
                                 headers={"Authorization": f"Bearer {alice_key}"})
    received = []

    async def consume():
        async for chunk in r.streaming_content:
            received.append(chunk)

    # Django's ASGI handler cancels the response task when the client disconnects.
    task = asyncio.create_task(consume())
    await asyncio.wait_for(fake_bridge.hanging.wait(), 3)
    for _ in range(200):                    # the chunk written before the bridge hung reaches us
        if b"Hel" in b"".join(received):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert b"Hel" in b"".join(received)
    assert fake_bridge.cancelled


def test_zero_budget_prewarms_and_reports_length(fake_bridge, alice_key):
    fake_bridge.script(*reply("x", completion_tokens=1))
    data = post(Client(), alice_key, body(max_tokens=0)).json()
    assert fake_bridge.requests[0].max_tokens == 1
    assert data["choices"][0]["message"]["content"] == "" and data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 0


def test_huge_budgets_are_clamped(fake_bridge, alice_key, settings):
    fake_bridge.script(*reply("x"))
    post(Client(), alice_key, body(max_tokens=10**12))
    assert fake_bridge.requests[0].max_tokens == settings.ENGINE_CTX
