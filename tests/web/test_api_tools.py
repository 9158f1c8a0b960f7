"""Tool calls on Chat, Messages and Responses with a scripted bridge: the prompt the tools and the
history render into, the streamed call frames (checked against the SDKs' own event types and the
§12 oracles), the buffered objects, finish mapping, and the 400s for malformed tools, choices and
results. The scripted text is split mid-marker and mid-argument, as the engine's tokens split it.
End to end with the official SDKs: test_live_api_tools.py."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine_bridge.toolsyntax import call_text
from tests.web import sse_oracles as oracles
from tests.web.fakes import reply, serve_state
from tests.web.test_api_surfaces import post, stream

pytestmark = pytest.mark.django_db(transaction=True)
MSG = [{"role": "user", "content": "Weather in Paris and Rome?"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]
ANT_TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "parameters": SCHEMA, "strict": True}]


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}
    serve_state(monkeypatch, state)
    return state


def rescript(bridge, events):
    """The next generate() answers with `events` (FakeBridge repeats its only script otherwise)."""
    bridge.scripts[:] = [events]


def split(text, n=3):
    return [text[i:i + n] for i in range(0, len(text), n)]


def two_calls(prefix="Let me check.\n"):
    text = prefix + call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("get_weather", {"city": "Rome"})
    return split(text)


# --- Chat ---------------------------------------------------------------------------------------

async def test_chat_stream_sends_each_call_as_it_is_written(fake_bridge, alice_key):
    fake_bridge.script(*reply(*two_calls()))
    raw = await stream(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS})
    parsed = oracles.check_openai_stream(raw, "chat.completion.chunk")
    oracles.strict_openai_chunks(parsed, "chat.completion.chunk")
    deltas = [p["choices"][0]["delta"] for p in parsed if p["choices"]]
    frags = [tc for d in deltas for tc in d.get("tool_calls", [])]
    firsts = [f for f in frags if "id" in f]
    assert [f["index"] for f in firsts] == [0, 1]
    assert all(f["type"] == "function" and f["function"] == {"name": "get_weather", "arguments": ""} for f in firsts)
    assert all(set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in frags if "id" not in f)
    args = {i: "".join(f["function"]["arguments"] for f in frags if f["index"] == i) for i in (0, 1)}
    assert [json.loads(a) for a in args.values()] == [{"city": "Paris"}, {"city": "Rome"}]
    assert sum(1 for f in frags if f["index"] == 0 and "id" not in f) > 1  # streamed in pieces, not at the end
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check."
    assert [p["choices"][0]["finish_reason"] for p in parsed if p["choices"]][-1] == "tool_calls"
    # The prompt offers the tools in the generic form (the ChatML template reads no `tools`).
    prompt = fake_bridge.requests[0].prompt
    assert prompt.startswith("<|im_start|>system\n") and '"get_weather"' in prompt and "<tool_call>" in prompt


def test_chat_buffered_calls_and_a_tool_loop_history(fake_bridge, alice_key):
    from openai.types.chat import ChatCompletion

    fake_bridge.script(*reply(*two_calls("")))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS})
    data = r.json()
    ChatCompletion.model_validate(data)
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(c["id"].startswith("call_") for c in calls) and len({c["id"] for c in calls}) == 2
    # The loop's next turn: the calls (content null) and their results (one with list content).
    history = MSG + [choice["message"],
                     {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"},
                     {"role": "tool", "tool_call_id": calls[1]["id"], "content": [{"type": "text", "text": "rain"}]}]
    rescript(fake_bridge, reply("Sunny in Paris, rain in Rome."))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": history, "tools": CHAT_TOOLS})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop"
    prompt = fake_bridge.requests[-1].prompt
    assert call_text("get_weather", {"city": "Rome"}) in prompt
    assert '{"name": "get_weather", "content": "rain"}' in prompt
    # Rendering is pure: the first turn's prompt is a prefix of the second's.
    assert prompt.startswith(fake_bridge.requests[0].prompt)


def test_chat_cut_call_stays_length_with_its_text(fake_bridge, alice_key):
    text = call_text("get_weather", {"city": "Paris"})[:-14]
    fake_bridge.script(*reply(*split(text), finish_reason="length"))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS, "max_tokens": 9})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == text
    assert "tool_calls" not in choice["message"]


def test_chat_unparsable_call_is_text_and_none_parses_nothing(fake_bridge, alice_key):
    bad = '<tool_call>{"name": "get_weather", "arguments": {city: 1}}</tool_call>'
    fake_bridge.script(*reply(*split(bad)))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == bad
    good = call_text("get_weather", {"city": "Paris"})
    rescript(fake_bridge, reply(good))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS,
                                                 "tool_choice": "none"})
    assert r.json()["choices"][0]["message"]["content"] == good
    assert '"get_weather"' not in fake_bridge.requests[-1].prompt  # none offers no tools


def test_chat_one_call_without_parallel_and_legacy_functions(fake_bridge, alice_key):
    from openai.types.chat import ChatCompletion

    fake_bridge.script(*reply(*two_calls("")))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "parallel_tool_calls": False,
                                                 "tools": CHAT_TOOLS})
    msg = r.json()["choices"][0]["message"]
    assert len(msg["tool_calls"]) == 1 and "Rome" in msg["content"]
    # Legacy `functions` get the legacy answer: message.function_call, finish "function_call".
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG,
                                                 "functions": [{"name": "get_weather", "parameters": SCHEMA}]})
    ChatCompletion.model_validate(r.json())
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    assert choice["message"]["function_call"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    history = MSG + [{"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}},
                     {"role": "function", "name": "get_weather", "content": "sunny"}]
    rescript(fake_bridge, reply("ok"))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": history,
                                                 "functions": [{"name": "get_weather"}], "function_call": "auto"})
    assert r.status_code == 200 and '"content": "sunny"' in fake_bridge.requests[-1].prompt


# --- Anthropic Messages --------------------------------------------------------------------------

async def test_messages_stream_tool_use_blocks(fake_bridge, alice_key):
    fake_bridge.script(*reply(*two_calls()))
    raw = await stream(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "tools": ANT_TOOLS, "max_tokens": 64})
    events = oracles.check_anthropic_stream(raw)
    oracles.strict_anthropic_events(events)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == [0, 1, 2]
    assert [e["content_block"]["type"] for e in starts] == ["text", "tool_use", "tool_use"]
    assert all(b["content_block"]["id"].startswith("toolu_") and b["content_block"]["input"] == {} for b in starts[1:])
    for index, city in ((1, "Paris"), (2, "Rome")):
        parts = [e["delta"]["partial_json"] for e in events
                 if e["type"] == "content_block_delta" and e["index"] == index]
        assert all(e["delta"]["type"] == "input_json_delta" for e in events
                   if e["type"] == "content_block_delta" and e["index"] == index)
        assert json.loads("".join(parts)) == {"city": city}
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use"


def test_messages_buffered_and_tool_results(fake_bridge, alice_key):
    from anthropic.types import Message

    fake_bridge.script(*reply(*two_calls()))
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "tools": ANT_TOOLS, "max_tokens": 64})
    data = r.json()
    Message.model_validate(data)
    assert data["stop_reason"] == "tool_use" and [b["type"] for b in data["content"]] == ["text", "tool_use", "tool_use"]
    uses = data["content"][1:]
    assert [u["input"] for u in uses] == [{"city": "Paris"}, {"city": "Rome"}]
    history = MSG + [{"role": "assistant", "content": data["content"]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": uses[0]["id"], "content": "sunny"},
                         {"type": "tool_result", "tool_use_id": uses[1]["id"], "is_error": True,
                          "content": [{"type": "text", "text": "no station"}]},
                         {"type": "text", "text": "Summarise."}]}]
    rescript(fake_bridge, reply("Sunny."))
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": history, "tools": ANT_TOOLS, "max_tokens": 8})
    assert r.status_code == 200 and r.json()["stop_reason"] == "end_turn"
    prompt = fake_bridge.requests[-1].prompt
    assert '"content": "Error: no station"' in prompt and prompt.index("no station") < prompt.index("Summarise.")


def test_messages_disable_parallel_means_one_call(fake_bridge, alice_key):
    fake_bridge.script(*reply(*two_calls("")))
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "tools": ANT_TOOLS, "max_tokens": 64,
                                         "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}})
    assert [b["type"] for b in r.json()["content"]] == ["tool_use", "text"]


# --- Responses -----------------------------------------------------------------------------------

async def test_responses_stream_function_call_items(fake_bridge, alice_key):
    fake_bridge.script(*reply(*two_calls()))
    raw = await stream(alice_key, "/v1/responses", {"model": "tiny", "input": "Weather?", "tools": RESP_TOOLS})
    events = oracles.check_responses_stream(raw)
    oracles.strict_responses_events(events)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [e["item"]["type"] for e in added] == ["message", "function_call", "function_call"]
    assert [e["output_index"] for e in added] == [0, 1, 2]
    for e in added[1:]:
        item = e["item"]
        assert item["arguments"] == "" and item["id"].startswith("fc_") and item["call_id"].startswith("call_")
        deltas = [d["delta"] for d in events if d["type"] == "response.function_call_arguments.delta"
                  and d["item_id"] == item["id"]]
        done = next(d for d in events if d["type"] == "response.function_call_arguments.done" and d["item_id"] == item["id"])
        assert done["arguments"] == "".join(deltas) and json.loads(done["arguments"])["city"] in ("Paris", "Rome")
        assert done["output_index"] == e["output_index"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and [o["type"] for o in final["output"]] == ["message", "function_call", "function_call"]
    assert final["tools"][0]["name"] == "get_weather" and final["tool_choice"] == "auto"


def test_responses_buffered_and_call_outputs(fake_bridge, alice_key):
    from openai.types.responses import Response

    fake_bridge.script(*reply(*two_calls("")))
    r = post(alice_key, "/v1/responses", {"model": "tiny", "input": "Weather?", "tools": RESP_TOOLS})
    data = r.json()
    Response.model_validate(data)
    calls = [o for o in data["output"] if o["type"] == "function_call"]
    assert len(calls) == 2 and all(c["status"] == "completed" for c in calls)
    items = [{"role": "user", "content": "Weather?"}, *calls,
             *({"type": "function_call_output", "call_id": c["call_id"], "output": "sunny"} for c in calls)]
    rescript(fake_bridge, reply("Sunny."))
    r = post(alice_key, "/v1/responses", {"model": "tiny", "input": items, "tools": RESP_TOOLS})
    assert r.status_code == 200 and r.json()["output"][0]["type"] == "message"
    assert fake_bridge.requests[-1].prompt.count("<tool_response>\n{") == 2
    bad = items[:1] + [{"type": "function_call_output", "call_id": calls[0]["id"], "output": "x"}]  # the fc_ id
    r = post(alice_key, "/v1/responses", {"model": "tiny", "input": bad, "tools": RESP_TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1].call_id"


# --- refusals ------------------------------------------------------------------------------------

ANT_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}
REFUSALS = [
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ("/v1/chat/completions", {"tools": CHAT_TOOLS * 2}, "tools[1].name"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ("/v1/chat/completions", {"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ("/v1/chat/completions", {"tools": CHAT_TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"tools": CHAT_TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("/v1/chat/completions", {"messages": MSG + [{"role": "tool", "tool_call_id": "call_x", "content": "r"}]}, "messages[1].tool_call_id"),
    ("/v1/chat/completions", {"messages": MSG + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ("/v1/completions", {"prompt": "x", "tools": CHAT_TOOLS}, "tools"),
    ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("/v1/responses", {"input": "x", "tools": RESP_TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
]
ANT_REFUSALS = [
    ({"tools": [{"name": "f"}]}, "missing tools[0].input_schema"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
    ({"tools": ANT_TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name 'nope'"),
    ({"tools": ANT_TOOLS, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"messages": MSG + [ANT_USE, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2"}]}]},
     "messages[2].content[0].tool_use_id 'toolu_2' matches no tool_use"),
    ({"messages": MSG + [ANT_USE, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                                "is_error": "yes"}]}]}, "is_error must be a boolean"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "tool_use blocks belong"),
]


def test_malformed_tools_choices_and_results_are_400s_naming_the_field(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    for route, patch, param in REFUSALS:
        r = post(alice_key, route, {"model": "tiny", "messages": MSG, **patch})
        assert r.status_code == 400, (route, patch, r.content)
        assert r.json()["error"]["param"] == param, (patch, r.json())
    for patch, text in ANT_REFUSALS:
        r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "max_tokens": 4, **patch})
        assert r.status_code == 400 and r.json()["type"] == "error", (patch, r.content)
        assert text in r.json()["error"]["message"], (patch, r.json())
    assert not fake_bridge.requests


def test_forced_choices_are_refused_without_constrained_decoding(fake_bridge, alice_key):
    """An engine that does not announce grammars (MODEL "grammar": "CGD1"; the real colibri binary,
    this fixture's served model): required and a named tool are a 400 naming tool_choice, never
    unconstrained output passed off as a call."""
    fake_bridge.script(*reply("ok"))
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS,
                                                     "tool_choice": choice})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.content
        assert "constrained decoding" in r.json()["error"]["message"]
    r = post(alice_key, "/v1/messages", {"model": "tiny", "messages": MSG, "tools": ANT_TOOLS, "max_tokens": 4,
                                         "tool_choice": {"type": "any"}})
    assert r.status_code == 400 and "constrained decoding" in r.json()["error"]["message"]
    assert not fake_bridge.requests


def test_constrained_choices_submit_a_grammar(fake_bridge, alice_key, served_up):
    """On an engine that takes grammars, required and named submit one (engine_bridge.grammar);
    named finishes `stop` with the call, required `tool_calls`."""
    served_up["model"]["grammar"] = "CGD1"
    fake_bridge.script(*reply(*split('{"city": "Paris"}')))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS,
                                                 "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    choice = r.json()["choices"][0]
    assert fake_bridge.requests[-1].grammar
    assert choice["finish_reason"] == "stop"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    rescript(fake_bridge, reply(*split('[{"name": "get_weather", "arguments": {"city": "Rome"}}]')))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS,
                                                 "tool_choice": "required"})
    choice = r.json()["choices"][0]
    assert fake_bridge.requests[-1].grammar and choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}


# --- hostile shapes: only 400s, never a crash -----------------------------------------------------

_KEYS = ["type", "function", "name", "parameters", "input_schema", "description", "strict", "id", "arguments",
         "tool_calls", "role", "content", "tool_call_id", "tool_use_id", "is_error", "input", "call_id", "output",
         "disable_parallel_tool_use", "text"]
_VALUES = ["function", "tool_use", "tool_result", "text", "assistant", "user", "tool", "function_call",
           "function_call_output", "auto", "any", "required", "none", "get_weather", "{}", "[1]", "call_1"]
_json = st.recursive(st.none() | st.booleans() | st.integers(-2, 2) | st.sampled_from(_VALUES),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), kids, max_size=4),
                     max_leaves=12)


@settings(max_examples=400, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["tools", "tool_choice", "functions", "function_call", "messages",
                                             "input", "parallel_tool_calls"]), _json, max_size=4))
def test_hostile_tool_shapes_are_400s(body):
    from api import tools as tools_mod
    from api.errors import ApiError
    from api.intake import _check_tree  # noqa: F401  (the body passed intake's walk)

    for parse in (tools_mod.chat_plan, tools_mod.anthropic_plan, tools_mod.responses_plan,
                  lambda b: tools_mod.chat_messages(b, roles={"system", "user", "assistant", "tool", "function"},
                                                    text_types=("text",), rename={}),
                  tools_mod.anthropic_messages,
                  lambda b: tools_mod.responses_items(b, roles={"user", "assistant"}, text_types=("input_text",))):
        try:
            parse(body)
        except ApiError as exc:
            assert exc.status == 400 and exc.message


async def test_chat_legacy_functions_stream_function_call_deltas(fake_bridge, alice_key):
    fake_bridge.script(*reply(*split(call_text("get_weather", {"city": "Paris"}))))
    raw = await stream(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG,
                                                           "functions": [{"name": "get_weather", "parameters": SCHEMA}]})
    parsed = oracles.check_openai_stream(raw, "chat.completion.chunk")
    oracles.strict_openai_chunks(parsed, "chat.completion.chunk")
    deltas = [p["choices"][0]["delta"] for p in parsed if p["choices"]]
    calls = [d["function_call"] for d in deltas if "function_call" in d]
    assert calls[0] == {"name": "get_weather", "arguments": ""} and all("name" not in c for c in calls[1:])
    assert json.loads("".join(c["arguments"] for c in calls)) == {"city": "Paris"}
    assert [p["choices"][0]["finish_reason"] for p in parsed if p["choices"]][-1] == "function_call"


def test_each_of_n_choices_parses_its_own_calls(fake_bridge, alice_key):
    fake_bridge.script(*reply(*two_calls("")))
    r = post(alice_key, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS, "n": 2})
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1] and all(c["finish_reason"] == "tool_calls" for c in choices)
    ids = [tc["id"] for c in choices for tc in c["message"]["tool_calls"]]
    assert len(ids) == 4 and len(set(ids)) == 4
