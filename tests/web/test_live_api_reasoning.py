"""Reasoning apart from the answer, end to end: the official SDKs (openai 1.109, anthropic 0.69)
read the thinking through their own types from Daphne + the bridge worker + an engine.

Which engine: a test double. A random-weight model never writes `<think>` or a harmony channel,
so the scripted mux engine (tests/bridge/fake_engines/mux_fake.py, FAKE_SCRIPT=1) says the
prompt's last `<<SAY>>…<</SAY>>`, two bytes per DATA frame, so every marker arrives cut. The
served template is set with CHAT_TEMPLATE: a Qwen3-style `<think>` template written for this test
(it renders `reasoning_content` and honours `enable_thinking`), or any template with harmony's
markers (harmony prompts are rendered by engine_bridge.harmony, not by the template)."""
import sys

import httpx
import pytest

from api.models import ApiKey
from tests.support import procs
from tests.web import sse_oracles as oracles
from tests.web.conftest import anthropic_client, openai_client
from tests.web.live import start_stack
from tests.web.reasoning_sdk import (ANSWER, CALL, THOUGHT, chat_reasoning, messages_thinking, raw_stream,
                                     responses_reasoning, tool_call_on_every_surface)

pytestmark = pytest.mark.django_db(transaction=True)

THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
HARMONY_TEMPLATE = "{# a gpt-oss model: <|start|>role<|channel|>… (rendered by engine_bridge.harmony) #}"

QWEN_OUT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
HARMONY_OUT = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>"
               f"{ANSWER}<|return|>")


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
    chat_reasoning(openai_client(stack.url, key), say(output(stack)))


def test_messages_thinking_blocks_streamed_and_buffered(stack, key):
    ant = anthropic_client(stack.url, key)
    body, msg = messages_thinking(ant, say(output(stack)))
    # the assistant turn sent back with its thinking block
    body["messages"] += [{"role": "assistant", "content": [b.model_dump() for b in msg.content]},
                         {"role": "user", "content": say(output(stack))}]
    assert ant.messages.create(**body).content[-1].text == ANSWER


def test_responses_reasoning_items(stack, key):
    oai = openai_client(stack.url, key)
    r = responses_reasoning(oai, say(output(stack)))
    raw = httpx.post(stack.url + "/v1/responses", json={"model": "colibri", "input": say(output(stack)), "stream": True},
                     headers={"Authorization": f"Bearer {key}"}, timeout=60).text
    oracles.check_responses_stream(raw)
    # a reasoning item sent back before its message
    items = [{"role": "user", "content": "hi"}, *[i.model_dump(exclude_none=True) for i in r.output],
             {"role": "user", "content": say(output(stack))}]
    assert oai.responses.create(model="colibri", input=items).output_text == ANSWER


@pytest.mark.parametrize("stack", ["harmony"], indirect=True)  # harmony's commentary channel
def test_harmony_tool_call_on_every_surface(stack, key):
    tool_call_on_every_surface(openai_client(stack.url, key), anthropic_client(stack.url, key), say(CALL))


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
        return raw_stream(stack.url, key, route, body)

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
