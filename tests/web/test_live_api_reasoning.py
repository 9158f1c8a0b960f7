"""Reasoning apart from the answer, end to end: the official SDKs (openai 1.109, anthropic 0.69)
read the thinking through their own types from Daphne + the bridge worker + an engine.

Which engine: a test double. A random-weight model never writes `<think>` or a harmony channel,
so the scripted mux engine (tests/bridge/fake_engines/mux_fake.py, FAKE_SCRIPT=1) says the
prompt's last `<<SAY>>…<</SAY>>`, two bytes per DATA frame, so every marker arrives cut. The
served template is set with CHAT_TEMPLATE: a Qwen3-style `<think>` template written for this test
(it renders `reasoning_content` and honours `enable_thinking`), or any template with harmony's
markers (harmony prompts are rendered by engine_bridge.harmony, not by the template)."""
import json
import sys

import httpx
import pytest

from api.models import ApiKey
from tests.support import procs
from tests.web import sse_oracles as oracles
from tests.web.conftest import anthropic_client, openai_client
from tests.web.live import start_stack

pytestmark = pytest.mark.django_db(transaction=True)

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
HARMONY_TEMPLATE = "{# a gpt-oss model: <|start|>role<|channel|>… (rendered by engine_bridge.harmony) #}"

THOUGHT = "The user greets me.\nI greet back."
ANSWER = "Hello there!"
QWEN_OUT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
HARMONY_OUT = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>"
               f"{ANSWER}<|return|>")
HARMONY_CALL = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def say(text):
    return f"hi <<SAY>>{text}<</SAY>>"


def _stack(django_db_blocker, tmp_path_factory, template):
    command = f"{sys.executable} {procs.ROOT / 'tests' / 'bridge' / 'fake_engines' / 'mux_fake.py'}"
    return start_stack(django_db_blocker, tmp_path_factory, {
        "ENGINE_COMMAND": command, "ENGINE_MODEL": "/srv/models/fake-moe.gguf", "CTX": "16384",
        "FAKE_SCRIPT": "1", "FAKE_DELAY": "0.002", "CHAT_TEMPLATE": template})


@pytest.fixture(scope="module", params=["think", "harmony"])
def stack(request, django_db_setup, django_db_blocker, tmp_path_factory):
    template = THINK_TEMPLATE if request.param == "think" else HARMONY_TEMPLATE
    with _stack(django_db_blocker, tmp_path_factory, template) as live:
        live.mode = request.param
        yield live


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="reasoning")[1]


def output(stack):
    return QWEN_OUT if stack.mode == "think" else HARMONY_OUT


def test_chat_reasoning_content_buffered_and_streamed(stack, key):
    oai = openai_client(stack.url, key)
    messages = [{"role": "user", "content": say(output(stack))}]
    r = oai.chat.completions.create(model="colibri", messages=messages, reasoning_effort="high")
    msg = r.choices[0].message
    assert msg.content == ANSWER and msg.model_extra["reasoning_content"] == THOUGHT
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens
    chunks = list(oai.chat.completions.create(model="colibri", messages=messages, stream=True,
                                              stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER
    assert [c.usage for c in chunks if c.usage][0].completion_tokens_details.reasoning_tokens > 0
    # the turn sent back with its reasoning renders and answers again
    messages += [msg.model_dump(exclude_none=True), {"role": "user", "content": say(output(stack))}]
    again = oai.chat.completions.create(model="colibri", messages=messages)
    assert again.choices[0].message.content == ANSWER


def test_messages_thinking_blocks_streamed_and_buffered(stack, key):
    ant = anthropic_client(stack.url, key)
    body = {"model": "colibri", "max_tokens": 400, "messages": [{"role": "user", "content": say(output(stack))}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    thinking, signatures, text = [], [], []
    with ant.messages.stream(**body) as s:
        for event in s:
            if event.type == "thinking":
                thinking.append(event.thinking)
            elif event.type == "signature":
                signatures.append(event.signature)
            elif event.type == "text":
                text.append(event.text)
        final = s.get_final_message()
    assert "".join(thinking) == THOUGHT and "".join(text) == ANSWER and len(signatures) == 1 and signatures[0]
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT and final.content[0].signature == signatures[0]
    assert final.stop_reason == "end_turn"
    msg = ant.messages.create(**body)
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[1].text == ANSWER
    # the assistant turn sent back with its thinking block
    body["messages"] += [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                         {"role": "user", "content": say(output(stack))}]
    assert ant.messages.create(**body).content[-1].text == ANSWER


def test_responses_reasoning_items(stack, key):
    oai = openai_client(stack.url, key)
    r = oai.responses.create(model="colibri", input=say(output(stack)), reasoning={"effort": "low"})
    assert [i.type for i in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == THOUGHT and r.output_text == ANSWER
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    kinds, deltas = [], []
    with oai.responses.stream(model="colibri", input=say(output(stack))) as s:
        for event in s:
            kinds.append(event.type)
            if event.type == "response.reasoning_text.delta":
                deltas.append(event.delta)
        final = s.get_final_response()
    assert "".join(deltas) == THOUGHT and final.output_text == ANSWER
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    raw = httpx.post(stack.url + "/v1/responses", json={"model": "colibri", "input": say(output(stack)), "stream": True},
                     headers={"Authorization": f"Bearer {key}"}, timeout=60).text
    oracles.check_responses_stream(raw)
    # a reasoning item sent back before its message
    items = [{"role": "user", "content": "hi"}, *[i.model_dump(exclude_none=True) for i in r.output],
             {"role": "user", "content": say(output(stack))}]
    assert oai.responses.create(model="colibri", input=items).output_text == ANSWER


@pytest.mark.parametrize("stack", ["harmony"], indirect=True)  # harmony's commentary channel
def test_harmony_tool_call_on_every_surface(stack, key):
    oai, ant = openai_client(stack.url, key), anthropic_client(stack.url, key)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]
    r = oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": say(HARMONY_CALL)}],
                                    tools=tools)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.model_extra["reasoning_content"] == "Need the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Paris"})]
    m = ant.messages.create(model="colibri", max_tokens=300, messages=[{"role": "user", "content": say(HARMONY_CALL)}],
                            tools=[{"name": "get_weather", "description": "Weather", "input_schema": SCHEMA}])
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[1].input == {"city": "Paris"}
    resp = oai.responses.create(model="colibri", input=say(HARMONY_CALL),
                                tools=[{"type": "function", "name": "get_weather", "parameters": SCHEMA}])
    assert [i.type for i in resp.output] == ["reasoning", "function_call"]
    assert json.loads(resp.output[1].arguments) == {"city": "Paris"}


def test_models_without_reasoning_fields_are_unaffected_by_the_split(stack, key):
    """Legacy Completions sends the prompt raw: the model's markup comes back as written."""
    oai = openai_client(stack.url, key)
    text = output(stack)
    r = oai.completions.create(model="colibri", prompt=say(text), max_tokens=400)
    assert r.choices[0].text == text


def test_messages_thinking_budget_is_enforced(stack, key):
    """budget_tokens: the bridge closes the thinking when it is spent and the model answers (the
    scripted engine says <<THEN>> for the continuation the bridge submits)."""
    ant = anthropic_client(stack.url, key)
    if stack.mode == "think":
        long = "<think>\n" + "Still thinking it over. " * 40 + "\n</think>\n\nnever"
    else:
        long = "<|channel|>analysis<|message|>" + "Still thinking it over. " * 40 + "<|end|>"
    then = "Short answer." + ("" if stack.mode == "think" else "<|return|>")
    content = f"hi <<SAY>>{long}<</SAY>> <<THEN>>{then}<</THEN>>"
    msg = ant.messages.create(model="colibri", max_tokens=500, messages=[{"role": "user", "content": content}],
                              thinking={"type": "enabled", "budget_tokens": 16})
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[1].text == "Short answer." and msg.stop_reason == "end_turn"
    assert 0 < len(msg.content[0].thinking.encode()) <= 2 * 16 and "never" not in msg.content[0].thinking


def test_raw_streams_pass_the_wire_oracles(stack, key):
    """Every record of the three streams validates against the SDKs' own event types."""
    def raw(route, body):
        with httpx.stream("POST", stack.url + route, json={**body, "stream": True}, timeout=60,
                          headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status_code == 200, r.read()
            return r.read().decode()

    msgs = [{"role": "user", "content": say(output(stack))}]
    chat = oracles.check_openai_stream(raw("/v1/chat/completions", {"model": "colibri", "messages": msgs}),
                                       "chat.completion.chunk")
    oracles.strict_openai_chunks(chat, "chat.completion.chunk")
    assert any("reasoning_content" in c["choices"][0]["delta"] for c in chat if c["choices"])
    events = oracles.check_anthropic_stream(raw("/v1/messages", {"model": "colibri", "max_tokens": 400, "messages": msgs}))
    oracles.strict_anthropic_events(events)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    resp = oracles.check_responses_stream(raw("/v1/responses", {"model": "colibri", "input": say(output(stack))}))
    oracles.strict_responses_events(resp)
    added = [e["item"]["type"] for e in resp if e["type"] == "response.output_item.added"]
    assert added == ["reasoning", "message"]
