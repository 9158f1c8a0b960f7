"""The four generation surfaces with a scripted bridge: wire shapes and event order (the §12
oracles plus the SDKs' own types), finish mapping, DS4 rules, envelopes, engine-not-ready.
The same surfaces against the real engine with the official SDKs: test_live_api_surfaces.py."""
import json

import pytest
from django.test import AsyncClient, Client

from tests.web import sse_oracles as oracles
from tests.web.fakes import done_event, reply, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


def post(key, route, data, **headers):
    return Client().post(route, json.dumps(data), content_type="application/json",
                         HTTP_AUTHORIZATION=f"Bearer {key}", **headers)


async def stream(key, route, data):
    r = await AsyncClient().post(route, json.dumps({**data, "stream": True}), content_type="application/json",
                                 headers={"Authorization": f"Bearer {key}", "Accept": "application/json"})
    assert r.status_code == 200 and r["Content-Type"] == "text/event-stream", r
    return b"".join([chunk async for chunk in r.streaming_content]).decode()


def died(*texts):
    return reply(*texts)[:-1] + [{"kind": "error", "code": "ENGINE_DIED",
                                  "message": "The engine stopped unexpectedly; your partial reply was kept. Restarting…"}]


# --- legacy Completions -------------------------------------------------------------------------

def test_completions_buffered(fake_bridge, alice_key):
    from openai.types import Completion

    fake_bridge.script(*reply("Hel", "lo", finish_reason="length"))
    r = post(alice_key, "/v1/completions", {"model": "tiny", "prompt": ["Once"], "max_tokens": 2})
    data = r.json()
    Completion.model_validate(data)
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert data["choices"][0]["text"] == "Hello" and data["choices"][0]["finish_reason"] == "length"
    assert fake_bridge.requests[0].prompt == "Once"  # raw: no chat template


async def test_completions_stream_is_never_chat_chunks(fake_bridge, alice_key):
    fake_bridge.script(*reply("Hel", "lo"))
    raw = await stream(alice_key, "/v1/completions", {"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}})
    parsed = oracles.check_openai_stream(raw, "text_completion")
    oracles.strict_openai_chunks([p for p in parsed if p["choices"]], "text_completion")
    assert "".join(p["choices"][0]["text"] for p in parsed if p["choices"]) == "Hello"
    assert [p["choices"][0]["finish_reason"] for p in parsed if p["choices"]][-1] == "stop"
    assert parsed[-1]["usage"]["completion_tokens"] == 2


# --- Anthropic Messages -------------------------------------------------------------------------

def test_messages_buffered(fake_bridge, alice_key):
    from anthropic.types import Message

    fake_bridge.script(*reply("Hel", "lo"))
    r = post(alice_key, "/v1/messages", {"model": "tiny", "system": [{"type": "text", "text": "Be brief."}],
                                         "messages": MSG, "max_tokens": 8})
    data = r.json()
    Message.model_validate(data)
    assert data["id"].startswith("msg_") and data["content"] == [{"type": "text", "text": "Hello"}]
    assert data["stop_reason"] == "end_turn" and data["usage"]["input_tokens"] == 7
    assert "Be brief." in fake_bridge.requests[0].prompt


@pytest.mark.parametrize("done_kw,stop_reason,stop_sequence", [
    ({"finish_reason": "length"}, "max_tokens", None),
    ({"finish_reason": "stop"}, "end_turn", None),
])
async def test_messages_stream_order_and_finish(fake_bridge, alice_key, done_kw, stop_reason, stop_sequence):
    fake_bridge.script(*reply("Hel", "lo", **done_kw))
    raw = await stream(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 8})
    events = oracles.check_anthropic_stream(raw)
    oracles.strict_anthropic_events(events)
    assert any(e["type"] == "ping" for e in events)
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
    assert delta["usage"]["output_tokens"] == 2
    start = next(e for e in events if e["type"] == "message_start")
    assert start["message"]["usage"]["input_tokens"] == 7


async def test_messages_stop_sequence_when_the_bridge_names_it(fake_bridge, alice_key):
    events = reply("Hel")
    events[-1] = {**done_event(), "stop_sequence": "END"}
    fake_bridge.script(*events)
    raw = await stream(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "stop_sequences": ["END"]})
    delta = next(e for e in oracles.check_anthropic_stream(raw) if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert fake_bridge.requests[0].stop == ["END"]


def test_messages_zero_budget_prewarms(fake_bridge, alice_key):
    fake_bridge.script(*reply("x", completion_tokens=1))
    data = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 0}).json()
    assert data["content"] == [] and data["stop_reason"] == "max_tokens" and data["usage"]["output_tokens"] == 0
    assert fake_bridge.requests[0].max_tokens == 1


async def test_messages_zero_budget_stream_has_no_block(fake_bridge, alice_key):
    fake_bridge.script(*reply("x", completion_tokens=1))
    raw = await stream(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 0})
    names = [e["type"] for e in oracles.check_anthropic_stream(raw)]
    assert names[names.index("message_start"):] == ["message_start", "message_delta", "message_stop"]


# --- Responses ----------------------------------------------------------------------------------

def test_responses_buffered(fake_bridge, alice_key):
    from openai.types.responses import Response

    fake_bridge.script(*reply("Hel", "lo"))
    r = post(alice_key, "/v1/responses", {"model": "tiny", "instructions": "Be brief.", "store": False,
                                          "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]},
             HTTP_IDEMPOTENCY_KEY="abc")
    data = r.json()
    Response.model_validate(data)
    assert data["object"] == "response" and data["id"].startswith("resp_") and data["status"] == "completed"
    assert data["output"][0]["content"][0]["text"] == "Hello"
    assert data["usage"]["total_tokens"] == 9 and data["usage"]["input_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("finish,terminal", [("stop", "response.completed"), ("length", "response.incomplete")])
async def test_responses_stream_order(fake_bridge, alice_key, finish, terminal):
    fake_bridge.script(*reply("Hel", "lo", finish_reason=finish))
    raw = await stream(alice_key, "/v1/responses", {"model": "tiny", "input": "hi"})
    events = oracles.check_responses_stream(raw)
    oracles.strict_responses_events(events)
    assert events[-1]["type"] == terminal
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Hello"
    if finish == "length":
        assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# --- errors after the stream started: the surface's own in-band shape ----------------------------

async def test_an_engine_death_mid_stream_is_an_in_band_error_per_surface(fake_bridge, alice_key):
    for route, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "x"}),
                        ("/v1/messages", {"messages": MSG}), ("/v1/responses", {"input": "x"})):
        fake_bridge.script(*died("Hel"))
        raw = await stream(alice_key, route, {"model": "tiny", **body})
        assert "partial reply was kept" not in raw and "[DONE]" not in raw
        last_event, last = oracles.sse_records(raw)[-1]
        last = json.loads(last)
        if route == "/v1/messages":
            assert last_event == "error" and last["error"]["type"] == "api_error"
        elif route == "/v1/responses":
            events = oracles.check_responses_stream(raw)
            assert events[-1]["type"] == "response.failed"
            assert events[-1]["response"]["error"]["code"] == "server_error"
        else:
            assert last["error"]["type"] == "server_error"


# --- DS4 rules: refused inputs name the client's own field, in the surface's envelope ------------

REFUSALS = [
    ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": -1}, "max_completion_tokens", "max_completion_tokens must be >= 0"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens", "max_tokens must be >= 0"),
    ("/v1/messages", {"messages": MSG, "max_tokens": -1}, None, "max_tokens must be >= 0"),
    ("/v1/responses", {"input": "x", "max_output_tokens": -1}, "max_output_tokens", "max_output_tokens must be >= 0"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": "json_object"}, "response_format", "'json_object' is not supported"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "xml"}}, "response_format", "'xml' is not supported"),
    ("/v1/responses", {"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format", "text.format type 'json_schema'"),
    ("/v1/messages", {"messages": MSG, "output_format": {"type": "json_schema"}}, None, "output_format type 'json_schema'"),
    ("/v1/messages", {"messages": MSG, "output_config": {"format": {"type": "json_object"}}}, None, "output_config.format type 'json_object'"),
    ("/v1/responses", {"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "replay full input instead"),
    ("/v1/responses", {"input": "x", "conversation": "c"}, "conversation", "replay full input instead"),
    ("/v1/completions", {"prompt": "x", "echo": True}, "echo", "echo is not supported"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt", "prompt must be"),
    ("/v1/completions", {}, "prompt", "missing prompt"),
    ("/v1/responses", {}, "input", "missing input"),
    ("/v1/messages", {}, None, "missing messages"),
    ("/v1/messages", {"messages": MSG, "top_k": -1}, None, "top_k must be an integer"),
    ("/v1/messages", {"messages": [{"role": "system", "content": "x"}]}, None, "messages[0].role"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].call_id", "matches no earlier function_call"),
    ("/v1/responses", {"input": [{"type": "web_search_call"}]}, "input[0].type", "not supported"),
    ("/v1/responses", {"input": [{"type": "reasoning", "content": "x"}]}, "input[0].content", "must be an array"),
    ("/v1/chat/completions", {"messages": MSG, "reasoning_effort": "max"}, "reasoning_effort", "reasoning_effort must be one of"),
    ("/v1/messages", {"messages": MSG, "thinking": {"type": "enabled"}}, None, "thinking.budget_tokens must be a positive integer"),
    ("/v1/messages", {"messages": MSG, "thinking": {"type": "sometimes"}}, None, "thinking.type 'sometimes' is not supported"),
    ("/v1/chat/completions", {"messages": MSG, "chat_template_kwargs": {"enable_thinking": "no"}},
     "chat_template_kwargs.enable_thinking", "must be a boolean"),
    ("/v1/responses", {"input": "x", "reasoning": {"effort": 3}}, "reasoning.effort", "reasoning.effort must be one of"),
    ("/v1/messages", {"messages": MSG, "output_format": {"type": "json_object"}, "output_config": {"format": {"type": "json_object"}}},
     None, "send output_format or output_config.format, not both"),
    ("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "x", "reasoning_content": 3}]},
     "messages[0].reasoning_content", "must be a string"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "required"}, "tool_choice", "tool_choice=required requires at least one tool"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice.function.name", "'f' is not one of the tools"),
    ("/v1/responses", {"input": "x", "tool_choice": "unsupported"}, "tool_choice", "tool_choice=unsupported not supported"),
    ("/v1/messages", {"messages": MSG, "tool_choice": {"type": "tool", "name": "f"}}, None, "tool_choice.name 'f' is not one of the tools"),
    ("/v1/messages", {"messages": MSG, "tool_choice": {"type": "any"}}, None, "tool_choice=any requires at least one tool"),
]


def test_refusals_name_the_field_in_the_envelope(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    for route, patch, param, text in REFUSALS:
        r = post(alice_key, route, {"model": "tiny", **patch})
        assert r.status_code == 400, (route, patch, r.content)
        err = r.json()["error"]
        assert text in err["message"], (route, patch, err)
        if route == "/v1/messages":
            assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
        else:
            assert err["param"] == param, (route, patch, err)
    assert not fake_bridge.requests


def test_null_durable_references_and_text_format_are_accepted(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    r = post(alice_key, "/v1/responses", {"model": "tiny", "input": "x", "previous_response_id": None,
                                          "conversation": None, "text": {"format": {"type": "text"}},
                                          "tool_choice": "auto", "tools": []})
    assert r.status_code == 200, r.content
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "tool_choice": {"type": "none"}})
    assert r.status_code == 200, r.content


# --- engine not ready, envelopes, models ---------------------------------------------------------

@pytest.mark.parametrize("status", ["starting", "down"])
def test_engine_not_ready_is_503_with_retry_after_never_404(fake_bridge, alice_key, served_up, status):
    served_up.update(status=status, up=False, model=None)  # no MODEL line yet
    r = post(alice_key, "/v1/chat/completions", {"model": "whatever-the-name-will-be", "messages": MSG})
    assert r.status_code == 503 and int(r["Retry-After"]) > 0 and r.json()["error"]["code"] == "engine_unavailable"
    r = post(alice_key, "/v1/messages", {"model": "x", "messages": MSG})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error" and r["Retry-After"]
    assert not fake_bridge.requests


def test_anthropic_envelope_for_auth_and_unknown_models(fake_bridge):
    r = Client().post("/v1/messages", json.dumps({"model": "tiny", "messages": MSG}), content_type="application/json",
                      HTTP_X_API_KEY="col-nope")
    assert r.status_code == 401 and r.json() == {"type": "error", "error": {"type": "authentication_error",
                                                                             "message": r.json()["error"]["message"]}}
    r = Client().get("/v1/models", HTTP_ANTHROPIC_VERSION="2023-06-01")
    assert r.status_code == 401 and r.json()["type"] == "error"


def test_unknown_routes_and_methods_answer_json(fake_bridge, alice_key):
    r = Client().get("/v1/nothing/here", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 404 and set(r.json()["error"]) >= {"message", "type", "param", "code"}
    r = Client().get("/v1/messages", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_models_in_both_styles(fake_bridge, alice_key):
    page = Client().get("/v1/models?limit=20", HTTP_AUTHORIZATION=f"Bearer {alice_key}",
                        HTTP_ANTHROPIC_VERSION="2023-06-01").json()
    assert page["has_more"] is False and page["first_id"] == page["data"][0]["id"]
    item = page["data"][0]
    assert item["type"] == "model" and item["created_at"].endswith("Z") and item["object"] == "model"
    after = Client().get(f"/v1/models?after_id={item['id']}", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()
    assert after["data"] == [] and after["has_more"] is False
    # Any accepted name works in a request; the answer names the typeable id.
    fake_bridge.script(*reply("ok"))
    for name in ("tiny", item["id"], "colibri"):
        assert post(alice_key, "/v1/chat/completions", {"model": name, "messages": MSG}).json()["model"] == item["id"]


def test_a_known_name_goes_to_the_bridge_which_says_when_to_retry(fake_bridge, alice_key, served_up):
    served_up.update(status="down", up=False)  # a late heartbeat must not decide alone
    fake_bridge.script({"kind": "submitted", "req": "r"},
                       {"kind": "error", "code": "ENGINE_UNAVAILABLE", "retry_after": 3,
                        "message": "The engine is not running right now (it is starting); retry in 3 s."})
    r = post(alice_key, "/v1/responses", {"model": "tiny", "input": "x"})
    assert r.status_code == 503 and r["Retry-After"] == "3" and len(fake_bridge.requests) == 1


def test_seed_is_refused_on_an_engine_without_our_extensions(fake_bridge, alice_key, served_up):
    served_up.update(model=None)  # up, but no MODEL line: e.g. the real colibri binary
    fake_bridge.script(*reply("ok"))
    r = post(alice_key, "/v1/chat/completions", {"model": "smollm2-135m-moe16", "messages": MSG, "seed": 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    assert post(alice_key, "/v1/chat/completions", {"model": "smollm2-135m-moe16", "messages": MSG}).status_code == 200


def test_browser_clients_get_cors_preflights_and_headers(fake_bridge, alice_key):
    r = Client().options("/v1/messages", HTTP_ORIGIN="https://app.example",
                         HTTP_ACCESS_CONTROL_REQUEST_METHOD="POST",
                         HTTP_ACCESS_CONTROL_REQUEST_HEADERS="x-api-key, anthropic-version, content-type")
    assert r.status_code == 204 and "POST" in r["Access-Control-Allow-Methods"]
    allowed = {h.strip().lower() for h in r["Access-Control-Allow-Headers"].split(",")}
    assert {"authorization", "x-api-key", "anthropic-version", "x-stainless-retry-count"} <= allowed
    fake_bridge.script(*reply("ok"))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG}, HTTP_ORIGIN="https://app.example")
    assert r.status_code == 200 and r["Access-Control-Allow-Origin"] == "*"
    r = post("col-nope", "/v1/chat/completions", {"model": "tiny", "messages": MSG})
    assert r.status_code == 401 and r["Access-Control-Allow-Origin"] == "*"


def test_omitted_sampling_is_the_served_models_recommendation(fake_bridge, alice_key, served_up):
    """The MODEL line's `sampling` (the GGUF's general.sampling.*), as the bridge and /health have
    it; Responses echoes the value used; a request's own value still wins."""
    served_up["model"] = {**served_up["model"], "sampling": {"temperature": 0.2, "top_p": 0.95}}
    fake_bridge.script(*reply("ok"))
    data = post(alice_key, "/v1/responses", {"model": "tiny", "input": "x"}).json()
    assert (data["temperature"], data["top_p"]) == (0.2, 0.95)
    assert (fake_bridge.requests[0].temperature, fake_bridge.requests[0].top_p) == (0.2, 0.95)
    post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "temperature": 1.0})
    assert (fake_bridge.requests[1].temperature, fake_bridge.requests[1].top_p) == (1.0, 0.95)
    del served_up["model"]["sampling"]
    post(alice_key, "/v1/completions", {"model": "tiny", "prompt": "x"})
    assert (fake_bridge.requests[2].temperature, fake_bridge.requests[2].top_p) == (0.7, 1.0)
