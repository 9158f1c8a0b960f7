"""The browser UI's JSON endpoints (session + CSRF), API key issuing, export and titles."""
import json

import pytest
from django.test import Client

from api.models import ApiKey
from chat import services, titles
from chat.models import Conversation, Message
from tests.web.fakes import reply

pytestmark = pytest.mark.django_db


@pytest.fixture
def conv(alice):
    c = Conversation.objects.create(owner=alice, title="Paris trip")
    Message.objects.create(conversation=c, role="user", text="Where to eat?")
    Message.objects.create(conversation=c, role="assistant", text="Try *bistros*.", stats={"tok_s": 3.0})
    return c


def test_it_lists_and_searches(alice_client, conv, alice):
    Conversation.objects.create(owner=alice, title="Rust lifetimes")
    assert len(alice_client.get("/api/conversations").json()["conversations"]) == 2
    found = alice_client.get("/api/conversations?q=paris").json()["conversations"]
    assert [c["id"] for c in found] == [conv.pk]


def test_it_creates_renames_and_deletes(alice_client):
    created = alice_client.post("/api/conversations", {"title": "New"}, content_type="application/json").json()
    r = alice_client.patch(f"/api/conversations/{created['id']}", {"title": "Renamed"}, content_type="application/json")
    assert r.json()["title"] == "Renamed"
    assert alice_client.patch(f"/api/conversations/{created['id']}", {"title": ""}, content_type="application/json").status_code == 400
    assert alice_client.delete(f"/api/conversations/{created['id']}").status_code == 204
    assert not Conversation.objects.filter(pk=created["id"]).exists()


def test_it_returns_messages(alice_client, conv):
    data = alice_client.get(f"/api/conversations/{conv.pk}/messages").json()
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"]


def test_it_validates_ownership(conv, bob):
    c = Client()
    c.force_login(bob)
    assert c.get(f"/api/conversations/{conv.pk}/messages").status_code == 404
    assert c.delete(f"/api/conversations/{conv.pk}").status_code == 404
    assert c.get("/api/conversations").json()["conversations"] == []


def test_it_requires_login_and_csrf(alice):
    assert Client().get("/api/conversations").status_code == 403
    c = Client(enforce_csrf_checks=True)
    c.force_login(alice)
    assert c.post("/api/conversations", {}, content_type="application/json").status_code == 403


def test_it_issues_an_api_key_once(alice_client, alice):
    r = alice_client.post("/api/keys", {"name": "laptop"}, content_type="application/json")
    assert r.status_code == 201
    key = r.json()["key"]
    row = ApiKey.objects.get()
    assert key.startswith("col-" + row.prefix) and key not in row.hashed_secret
    assert ApiKey.lookup(key) == row
    assert "key" not in alice_client.get("/api/keys").json()["keys"][0]
    alice_client.delete(f"/api/keys/{row.pk}")
    assert ApiKey.lookup(key) is None


def test_it_exports_json_and_markdown(alice_client, conv):
    r = alice_client.get("/conversations/export?format=json")
    assert r["Content-Disposition"].startswith("attachment")
    data = json.loads(r.content)
    assert data["conversations"][0]["messages"][1]["text"] == "Try *bistros*."
    md = alice_client.get("/conversations/export?format=md").content.decode()
    assert "## Paris trip" in md and "### Assistant" in md and "Try *bistros*." in md
    assert alice_client.get("/conversations/export?format=pdf").status_code == 400


def test_the_export_task_stores_the_file(conv, alice, settings, tmp_path):
    from chat.tasks import export_conversations

    settings.MEDIA_ROOT = tmp_path
    path = export_conversations(alice.pk, "md")
    assert (tmp_path / path).read_text().startswith("# Conversations of alice")


@pytest.mark.django_db(transaction=True)
def test_it_titles_a_conversation_through_the_bridge(conv, fake_bridge):
    fake_bridge.script(*reply('Title: "Eating in Paris".\n'))
    assert titles.title_conversation(conv.pk) == "Eating in Paris"
    assert fake_bridge.requests[0].priority == "background"
    conv.refresh_from_db()
    assert conv.title == "Eating in Paris"


@pytest.mark.django_db(transaction=True)
def test_a_title_uses_the_conversations_own_model_and_template(conv, fake_bridge, monkeypatch):
    """Not the default model's: the prompt is in the conversation's model's template, the request
    goes to that model, and a reasoning model's thinking never becomes the title."""
    from dataclasses import replace

    from engine_bridge.served import served_model_from

    other = replace(served_model_from({}), id="qwen3-think", template=(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"))
    asked = []
    monkeypatch.setattr("chat.titles.served_model_get", lambda model=None: asked.append(model) or other)
    conv.model = "qwen3-think"
    conv.save()
    fake_bridge.script(*reply("Bistros of Paris"))
    assert titles.title_conversation(conv.pk) == "Bistros of Paris"
    request = fake_bridge.requests[0]
    assert asked == ["qwen3-think"] and request.model == "qwen3-think" and request.reasoning == "think"
    assert request.prompt.startswith("<user>Where to eat?<assistant>Try *bistros*.<user>Write a short title")
    assert request.prompt.endswith("<assistant><think>\n\n</think>\n\n")


@pytest.mark.django_db(transaction=True)
def test_a_long_first_message_is_titled_from_its_start(alice, fake_bridge):
    """A 12,000-character question and answer: the title's prompt holds the start of each, not a
    second turn's worth of prefill."""
    c = Conversation.objects.create(owner=alice, title="")
    question = "Summarise this report. " + "".join(f"Paragraph {i} says something else. " for i in range(400))
    Message.objects.create(conversation=c, role="user", text=question)
    Message.objects.create(conversation=c, role="assistant", text="The report says " + "much, " * 2000)
    fake_bridge.script(*reply("Report summary"))
    assert titles.title_conversation(c.pk) == "Report summary"
    prompt = fake_bridge.requests[0].prompt
    assert "Summarise this report. Paragraph 0 says" in prompt and "The report says much," in prompt
    assert "Paragraph 399" not in prompt and len(prompt) < 2 * titles.TITLE_SOURCE_CHARS + 500, len(prompt)


@pytest.mark.django_db(transaction=True)
def test_it_falls_back_to_the_first_words(conv, fake_bridge):
    fake_bridge.script({"kind": "error", "code": "ENGINE_UNAVAILABLE", "message": "down"})
    assert titles.title_conversation(conv.pk) == services.fallback_title("Where to eat?")


def test_a_nul_in_any_text_is_refused_naming_the_field(alice_client, conv):
    """Issue 24: PostgreSQL text cannot hold NUL; every surface refuses it with a 400 naming the
    field (DRF's null-character rule for titles and key names, the same rule for the search)."""
    for method, url, body, field in (
        ("post", "/api/conversations", {"title": "a\x00b"}, "title"),
        ("patch", f"/api/conversations/{conv.pk}", {"title": "\x00"}, "title"),
        ("post", "/api/keys", {"name": "k\x00"}, "name"),
    ):
        r = getattr(alice_client, method)(url, body, content_type="application/json")
        assert r.status_code == 400 and field in r.json(), (url, r.status_code, r.content[:200])
    r = alice_client.get("/api/conversations", {"q": "\x00"})
    assert r.status_code == 400 and "NUL" in r.json()["q"][0], r.content[:200]
    assert alice_client.get(f"/api/conversations/{conv.pk}").json()["title"] == "Paris trip"
    assert not ApiKey.objects.filter(name__startswith="k").exists()


@pytest.mark.django_db(transaction=True)
def test_a_model_title_with_a_nul_is_stored_with_a_replacement(conv, fake_bridge):
    fake_bridge.script(*reply("Paris\x00 food"))
    assert titles.title_conversation(conv.pk) == "Paris\ufffd food"
    assert Conversation.objects.get(pk=conv.pk).title == "Paris\ufffd food"
