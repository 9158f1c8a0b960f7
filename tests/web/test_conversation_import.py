"""Importing an API conversation into the chat page (issue 25 item 7; chat/imports.py): OpenAI
Chat messages with tool calls and tool results become one conversation, shown by the messages
endpoint and the export, and rendered into the next turn's prompt; bad input gets a 400 that names
the field and stores nothing."""
import json

import pytest
from django.test import Client

from chat import services
from chat.models import Conversation, Message
from engine_bridge.prompting import CHATML_TEMPLATE, render_prompt

pytestmark = pytest.mark.django_db
URL = "/api/conversations/import"
WEATHER_ARGS = '{"city": "Paris", "unit": "celsius"}'
MESSAGES = [
    {"role": "developer", "content": "You are a weather bot."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris "}, {"type": "text", "text": "and Oslo?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGS}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "error: bad arguments"}]},
    {"role": "assistant", "content": "Paris is at 18 °C."},
]


@pytest.fixture
def client(alice):
    c = Client()
    c.force_login(alice)
    return c


def post(client, body):
    return client.post(URL, json.dumps(body), content_type="application/json")


def test_an_openai_conversation_with_tool_calls_is_imported(client, alice):
    r = post(client, {"model": "any", "messages": MESSAGES, "tools": []})  # a request body as sent
    assert r.status_code == 201, r.content
    conv = Conversation.objects.get(pk=r.json()["id"], owner=alice)
    assert conv.title == "Weather in Paris and Oslo?"
    rows = list(conv.messages.all())
    assert [m.role for m in rows] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert rows[2].text == "" and rows[2].tool_calls == [
        {"id": "call_1", "name": "get_weather", "arguments": WEATHER_ARGS},
        {"id": "call_2", "name": "get_weather", "arguments": '{"city": "Oslo"'}]  # kept as written
    assert (rows[3].tool_call_id, rows[3].text) == ("call_1", '{"temperature": 18}')
    assert (rows[4].tool_call_id, rows[4].text) == ("call_2", "error: bad arguments")

    shown = client.get(f"/api/conversations/{conv.pk}/messages").json()["messages"]
    assert shown[2]["tool_calls"][0]["name"] == "get_weather" and shown[3]["tool_call_id"] == "call_1"
    assert shown[1]["tool_calls"] == [] and shown[1]["tool_call_id"] == ""

    exported = json.loads(client.get("/conversations/export?format=json").content)["conversations"][0]
    assert exported["messages"][2]["tool_calls"][1]["id"] == "call_2"
    md = client.get("/conversations/export?format=md").content.decode()
    assert "Tool call `get_weather` (call_1)" in md and WEATHER_ARGS in md and "### Tool (result of call_2)" in md


def test_the_next_turn_renders_the_calls_and_results(client):
    conv = Conversation.objects.get(pk=post(client, {"messages": MESSAGES[:5]}).json()["id"])
    history = services.prompt_messages(conv)
    assert history[2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
        {"id": "call_2", "name": "get_weather", "arguments": '{"city": "Oslo"'}]}  # not JSON: the text
    assert history[3] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temperature": 18}'}
    # A template without tool support still gets the results' text (the page's "Continue").
    prompt = render_prompt(history, template=CHATML_TEMPLATE, bos_token="", eos_token="")
    assert '<|im_start|>tool\n{"temperature": 18}<|im_end|>' in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_the_chat_turn_prompt_carries_the_calls_in_the_models_tool_syntax(client, monkeypatch):
    """The chat page's next turn (services._render): on a template without tools (ChatML, the
    default SmolLM2 model's) past calls become the generic <tool_call> JSON form and the results
    <tool_response> blocks, as the API renders them, not only the results' text."""
    from engine_bridge.served import served_model_from

    served = served_model_from({"status": "up", "updated": 1.0,
                                "model": {"name": "tiny", "arch": "llama", "chat_template": CHATML_TEMPLATE}})
    conv = Conversation.objects.get(pk=post(client, {"messages": MESSAGES[:5]}).json()["id"])
    prompt = services._render(services.prompt_messages(conv), served)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"name": "get_weather", "content": "{\\"temperature\\": 18}"}\n</tool_response>' in prompt
    assert "<|im_start|>tool" not in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_a_reasoning_models_thinking_is_imported_as_the_messages_thinking(client):
    """An assistant turn's reasoning_content (as /v1/chat/completions answers a reasoning model)
    is kept apart from its content, and stays out of the next turn's prompt."""
    r = post(client, {"messages": [{"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "4", "reasoning_content": "Two and two."}]})
    assert r.status_code == 201, r.content
    reply = Message.objects.get(role="assistant")
    assert (reply.text, reply.thinking) == ("4", "Two and two.")
    history = services.prompt_messages(reply.conversation)
    assert history[-1] == {"role": "assistant", "content": "4"}


@pytest.mark.parametrize("messages, field", [
    ([], "messages"),
    ([{"role": "function", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": "a\x00b"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": "hi", "tool_calls": MESSAGES[2]["tool_calls"]}], "messages[0].tool_calls"),
    ([MESSAGES[1], {"role": "assistant", "content": None}], "messages[1].content"),
    ([{**MESSAGES[2], "tool_calls": []}], "messages[0].tool_calls"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.name"),
    ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[0].tool_calls[0].id"),
    ([{"role": "assistant", "tool_calls": [{"id": "c", "type": "web", "function": {"name": "f", "arguments": "{}"}}]}],
     "messages[0].tool_calls[0].type"),
    ([MESSAGES[2], MESSAGES[2]], "messages[1].tool_calls[0].id"),       # an id used twice
    ([MESSAGES[1], {"role": "tool", "tool_call_id": "call_9", "content": "18"}], "messages[1].tool_call_id"),
    ([MESSAGES[2], MESSAGES[3], MESSAGES[3]], "messages[2].tool_call_id"),  # a second result for one call
    ([{"role": "user", "content": "hi", "reasoning_content": "hmm"}], "messages[0].reasoning_content"),
    ([MESSAGES[1], {"role": "assistant", "content": "4", "reasoning_content": ["hmm"]}], "messages[1].reasoning_content"),
    ([MESSAGES[1], {"role": "assistant", "content": "4", "reasoning_content": "a\x00b"}], "messages[1].reasoning_content"),
])
def test_bad_input_is_refused_naming_the_field(client, messages, field):
    r = post(client, {"messages": messages})
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field and r.json()["error"].startswith(field + ": ")
    assert not Message.objects.exists() and not Conversation.objects.exists()


def test_the_title_and_the_body_are_checked(client):
    assert post(client, ["not", "an", "object"]).json()["field"] == "body"
    assert post(client, {"messages": MESSAGES, "title": 3}).json()["field"] == "title"
    r = post(client, {"messages": [MESSAGES[2], MESSAGES[3]], "title": "  Weather API run  "})
    assert r.status_code == 201 and r.json()["title"] == "Weather API run"
    r = post(client, {"messages": [MESSAGES[2]]})
    assert r.json()["title"] == "Imported conversation"  # no user text to name it after


def test_it_needs_a_login_and_csrf_and_stays_private(alice, bob):
    assert Client().post(URL, json.dumps({"messages": MESSAGES}), content_type="application/json").status_code == 403
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(URL, json.dumps({"messages": MESSAGES}), content_type="application/json").status_code == 403
    c = Client()
    c.force_login(alice)
    conv_id = post(c, {"messages": MESSAGES}).json()["id"]
    other = Client()
    other.force_login(bob)
    assert other.get(f"/api/conversations/{conv_id}/messages").status_code == 404
