"""Tool calls end to end with the official SDKs (openai 1.109.1, anthropic 0.69.0) as clients:
Daphne + the bridge worker + an engine.

Which engine: the tiny fixture model has random weights and would almost never write a call, so
the wire tests run on the scripted mux engine (tests/bridge/fake_engines/mux_fake.py with
FAKE_SCRIPT=1: the prompt's last `<<SAY>>…<</SAY>>` is the model's output, two bytes per DATA
frame, so markers and arguments arrive split as tokens split them). The constrained choices
(required / named) run on the real engine and fixture model (live_stack), constrained by the
call's grammar: every call must parse (the refusal for an engine without grammars is in
test_api_tools.py)."""
import asyncio
import json
import sys

import anthropic
import httpx
import openai
import pydantic
import pytest

from api.models import ApiKey
from engine_bridge.toolsyntax import call_text
from tests.support import procs
from tests.web import sse_oracles as oracles
from tests.web.live import start_stack

pytestmark = pytest.mark.django_db(transaction=True)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                                "parameters": SCHEMA}}]
ANT_TOOLS = [{"name": "get_weather", "description": "Weather by city", "input_schema": SCHEMA}]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather by city", "parameters": SCHEMA,
               "strict": True}]


def say(text, question="What is the weather in Paris and Rome?"):
    return f"{question} <<SAY>>{text}<</SAY>>"


TWO_CALLS = "Let me check.\n" + call_text("get_weather", {"city": "Paris"}) + "\n" + call_text("get_weather", {"city": "Rome"})
ONE_CALL = call_text("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def scripted_stack(django_db_setup, django_db_blocker, tmp_path_factory):
    command = f"{sys.executable} {procs.ROOT / 'tests' / 'bridge' / 'fake_engines' / 'mux_fake.py'}"
    with start_stack(django_db_blocker, tmp_path_factory, {
            "ENGINE_COMMAND": command, "ENGINE_MODEL": "/srv/models/fake-moe.gguf", "CTX": "16384",
            "FAKE_SCRIPT": "1", "FAKE_DELAY": "0.002"}) as stack:
        yield stack


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="tools")[1]


@pytest.fixture
def oai(scripted_stack, key):
    return openai.OpenAI(base_url=scripted_stack.url + "/v1", api_key=key, max_retries=0, timeout=60,
                         _strict_response_validation=True)


@pytest.fixture
def ant(scripted_stack, key):
    return anthropic.Anthropic(base_url=scripted_stack.url, api_key=key, max_retries=0, timeout=60,
                               _strict_response_validation=True)


def raw_stream(stack, key, route, body):
    with httpx.stream("POST", stack.url + route, json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200, r.read()
        return r.read().decode()


def weather(city):
    return {"Paris": "sunny", "Rome": "rain"}[city]


# --- OpenAI Chat ----------------------------------------------------------------------------------

def test_chat_create_with_tools_buffered_and_streamed(oai, scripted_stack, key):
    r = oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": say(TWO_CALLS)}],
                                    tools=CHAT_TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    chunks = list(oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": say(TWO_CALLS)}],
                                              tools=CHAT_TOOLS, stream=True))
    calls = {}
    for chunk in chunks:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert entry["id"] is None  # id and name come once per call
                entry["id"], entry["name"] = tc.id, tc.function.name
            entry["arguments"] += tc.function.arguments or ""
    assert sorted(calls) == [0, 1] and all(c["name"] == "get_weather" and c["id"] for c in calls.values())
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == [{"city": "Paris"}, {"city": "Rome"}]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    raw = raw_stream(scripted_stack, key, "/v1/chat/completions",
                     {"model": "colibri", "messages": [{"role": "user", "content": say(TWO_CALLS)}], "tools": CHAT_TOOLS})
    oracles.strict_openai_chunks(oracles.check_openai_stream(raw, "chat.completion.chunk"), "chat.completion.chunk")


class Weather(pydantic.BaseModel):
    city: str


def test_chat_stream_helper_accumulates_the_arguments(oai):
    tool = openai.pydantic_function_tool(Weather, name="get_weather")  # strict, as .stream() demands
    deltas, done = [], []
    with oai.chat.completions.stream(model="colibri", messages=[{"role": "user", "content": say(TWO_CALLS)}],
                                     tools=[tool]) as s:
        for event in s:
            if event.type == "tool_calls.function.arguments.delta":
                deltas.append((event.index, event.arguments_delta))
            elif event.type == "tool_calls.function.arguments.done":
                done.append((event.index, event.name, event.parsed_arguments))
        final = s.get_final_completion()
    assert {d[0] for d in deltas} == {0, 1}  # (pieces per call depend on how the bridge batches tokens)
    assert done == [(0, "get_weather", Weather(city="Paris")), (1, "get_weather", Weather(city="Rome"))]
    calls = final.choices[0].message.tool_calls
    assert [c.function.parsed_arguments for c in calls] == [Weather(city="Paris"), Weather(city="Rome")]


def test_chat_full_tool_loop(oai):
    messages = [{"role": "user", "content": say(ONE_CALL, "Weather in Paris?")}]
    r = oai.chat.completions.create(model="colibri", messages=messages, tools=CHAT_TOOLS)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        result = weather(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{result} <<SAY>>It is {result} in Paris.<</SAY>>"})
    r = oai.chat.completions.create(model="colibri", messages=messages, tools=CHAT_TOOLS)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == "It is sunny in Paris."
    assert not r.choices[0].message.tool_calls


def test_chat_call_cut_by_max_tokens_is_length_and_text(oai):
    r = oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": say(ONE_CALL)}],
                                    tools=CHAT_TOOLS, max_tokens=12)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert choice.message.content == ONE_CALL[:24]  # two bytes a token: the partial call, as text


# --- OpenAI Responses -----------------------------------------------------------------------------

def test_responses_function_calls_buffered_streamed_and_looped(oai, scripted_stack, key):
    r = oai.responses.create(model="colibri", input=say(TWO_CALLS), tools=RESP_TOOLS)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(c.id.startswith("fc_") and c.call_id.startswith("call_") for c in calls)
    with oai.responses.stream(model="colibri", input=say(TWO_CALLS), tools=RESP_TOOLS) as s:
        events = list(s)
        final = s.get_final_response()
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    dones = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(dones) == 2 and {e.item_id for e in deltas} == {e.item_id for e in dones}
    assert [json.loads(c.arguments) for c in final.output if c.type == "function_call"] == [{"city": "Paris"}, {"city": "Rome"}]
    # The loop: the calls and their outputs replayed as input items (call_id, not the fc_ item id).
    items = [{"role": "user", "content": "Weather?"}, *(c.model_dump(exclude_none=True) for c in calls)]
    items += [{"type": "function_call_output", "call_id": c.call_id,
               "output": f"{weather(**json.loads(c.arguments))} <<SAY>>Sunny, then rain.<</SAY>>"} for c in calls]
    r = oai.responses.create(model="colibri", input=items, tools=RESP_TOOLS)
    assert r.output_text == "Sunny, then rain." and r.status == "completed"
    raw = raw_stream(scripted_stack, key, "/v1/responses", {"model": "colibri", "input": say(TWO_CALLS), "tools": RESP_TOOLS})
    oracles.strict_responses_events(oracles.check_responses_stream(raw))


# --- Anthropic Messages ---------------------------------------------------------------------------

def test_messages_tool_use_create_stream_and_loop(ant, scripted_stack, key):
    m = ant.messages.create(model="colibri", max_tokens=256, tools=ANT_TOOLS,
                            messages=[{"role": "user", "content": say(TWO_CALLS)}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in m.content[1:]] == [{"city": "Paris"}, {"city": "Rome"}]
    partial = []
    with ant.messages.stream(model="colibri", max_tokens=256, tools=ANT_TOOLS,
                             messages=[{"role": "user", "content": say(TWO_CALLS)}]) as s:
        for event in s:
            if event.type == "input_json":
                partial.append(event.partial_json)
        final = s.get_final_message()
    assert len(partial) >= 2 and final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [u.input for u in uses] == [{"city": "Paris"}, {"city": "Rome"}] and all(u.id.startswith("toolu_") for u in uses)
    # The loop: tool_result blocks answer the tool_use ids (one an error).
    results = [{"type": "tool_result", "tool_use_id": uses[0].id, "content": weather("Paris")},
               {"type": "tool_result", "tool_use_id": uses[1].id, "is_error": True,
                "content": [{"type": "text", "text": "station down <<SAY>>Sunny in Paris.<</SAY>>"}]}]
    m = ant.messages.create(model="colibri", max_tokens=256, tools=ANT_TOOLS, messages=[
        {"role": "user", "content": say(TWO_CALLS)}, {"role": "assistant", "content": final.content},
        {"role": "user", "content": results}])
    assert m.stop_reason == "end_turn" and m.content[0].text == "Sunny in Paris."
    raw = raw_stream(scripted_stack, key, "/v1/messages", {"model": "colibri", "max_tokens": 256, "tools": ANT_TOOLS,
                                                          "messages": [{"role": "user", "content": say(TWO_CALLS)}]})
    oracles.strict_anthropic_events(oracles.check_anthropic_stream(raw))


def test_messages_malformed_tool_result_is_a_400(ant):
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(model="colibri", max_tokens=8, tools=ANT_TOOLS, messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "x"}]}])
    assert "toolu_b" in str(exc.value) and exc.value.body["error"]["type"] == "invalid_request_error"


# --- the constrained choices, on the real engine and fixture model ---------------------------------

@pytest.fixture
def real_oai(live_stack, key):
    return openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_real_engine_auto_tools_render_and_answer(real_oai):
    r = real_oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                         tools=CHAT_TOOLS, max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls") and r.usage.prompt_tokens > 100


def test_real_engine_forced_calls_always_parse(real_oai):
    for choice, finish in (("required", "tool_calls"), ({"type": "function", "function": {"name": "get_weather"}}, "stop")):
        for temperature in (0, 1):
            r = real_oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": "Weather?"}],
                                                 tools=CHAT_TOOLS, tool_choice=choice, max_tokens=400,
                                                 temperature=temperature)
            choice0 = r.choices[0]
            assert choice0.finish_reason == finish, choice0
            args = json.loads(choice0.message.tool_calls[0].function.arguments)
            assert isinstance(args.get("city"), str)


# --- frameworks: LangChain (langchain-openai, langchain-anthropic) and the OpenAI Agents SDK --------

def get_weather_fn(city: str) -> str:
    """Weather by city."""
    return weather(city)


def test_langchain_openai_bind_tools_invoke_and_stream(scripted_stack, key):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=scripted_stack.url + "/v1", api_key=key, model="colibri", max_retries=0, timeout=60)
    bound = llm.bind_tools([get_weather_fn])
    msg = bound.invoke(say(TWO_CALLS.replace("get_weather", "get_weather_fn")))
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather_fn", {"city": "Paris"}),
                                                                ("get_weather_fn", {"city": "Rome"})]
    assert msg.response_metadata["finish_reason"] == "tool_calls"
    total = None
    for chunk in bound.stream(say(TWO_CALLS.replace("get_weather", "get_weather_fn"))):
        total = chunk if total is None else total + chunk
    assert [c["args"] for c in total.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert len({c["id"] for c in total.tool_calls}) == 2


def test_langchain_anthropic_bind_tools(scripted_stack, key):
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(base_url=scripted_stack.url, api_key=key, model="colibri", max_retries=0, timeout=60)
    msg = llm.bind_tools([get_weather_fn]).invoke(say(ONE_CALL.replace("get_weather", "get_weather_fn")))
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == [("get_weather_fn", {"city": "Paris"})]
    assert msg.response_metadata["stop_reason"] == "tool_use"


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_openai_agents_sdk_runs_one_tool_loop(scripted_stack, key, api):
    import agents

    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=scripted_stack.url + "/v1", api_key=key, max_retries=0, timeout=60)
    model_cls = agents.OpenAIChatCompletionsModel if api == "chat" else agents.OpenAIResponsesModel
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather by city."""
        seen.append(city)
        return f"{weather(city)} <<SAY>>It is {weather(city)} in {city}.<</SAY>>"

    agent = agents.Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather],
                         model=model_cls(model="colibri", openai_client=client))
    # asyncio.run, not Runner.run_sync: run_sync uses the thread's current loop, which an earlier
    # async test of the run may have closed ("There is no current event loop")
    result = asyncio.run(agents.Runner.run(agent, say(ONE_CALL, "Weather in Paris?"), max_turns=3))
    assert seen == ["Paris"] and result.final_output == "It is sunny in Paris."


def test_langchain_with_structured_output_on_the_real_engine(live_stack, key):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=live_stack.url + "/v1", api_key=key, model="colibri", max_retries=0, timeout=60,
                     max_tokens=400, temperature=0)
    out = llm.with_structured_output(Weather, method="function_calling").invoke("Weather in Paris?")
    assert isinstance(out, Weather)
