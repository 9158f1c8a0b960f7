"""A conversation's model and system prompt (issue 26 item 3) through the session endpoints, the
chat socket and the turn's prompt: what is stored is checked first (an unknown model, an over-long
or NUL-bearing system prompt are refused naming the field, and change nothing), and the next turn
renders with them and goes to that model. The bridge is scripted (tests/web/fakes.FakeBridge) and
the served model's facts are those of a bridge telemetry state with no registry (one bridge)."""
import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from chat import services
from chat.models import SYSTEM_PROMPT_CHARS, Conversation, Message
from engine_bridge.served import served_model_get
from tests.web.fakes import connect, frames_until, reply, serve_state

pytestmark = pytest.mark.django_db(transaction=True)
STATE = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}}


@pytest.fixture
def served(fake_bridge, monkeypatch):
    serve_state(monkeypatch, STATE)
    return served_model_get()


@pytest.fixture
def conv(alice):
    return Conversation.objects.create(owner=alice, title="Sea")


def patch(alice_client, conv, body):
    return alice_client.patch(f"/api/conversations/{conv.pk}", body, content_type="application/json")


def test_patch_stores_a_served_models_id_and_the_system_prompt(alice_client, conv, served):
    r = patch(alice_client, conv, {"model": "tiny", "system_prompt": "  Answer in French.\n"})
    assert r.status_code == 200, r.content
    assert r.json()["model"] == served.id and r.json()["system_prompt"] == "  Answer in French.\n"
    conv.refresh_from_db()
    assert (conv.model, conv.system_prompt, conv.title) == (served.id, "  Answer in French.\n", "Sea")
    assert alice_client.get(f"/api/conversations/{conv.pk}").json()["model"] == served.id
    listed = alice_client.get("/api/conversations").json()["conversations"][0]
    assert listed["model"] == served.id and "system_prompt" not in listed  # the list stays small
    assert patch(alice_client, conv, {"model": ""}).json()["model"] == ""  # back to the default


@pytest.mark.parametrize("body,field,says", [
    ({"model": "no-such-model"}, "model", "'no-such-model' is not served here"),
    ({"system_prompt": "x" * (SYSTEM_PROMPT_CHARS + 1)}, "system_prompt", str(SYSTEM_PROMPT_CHARS)),
    ({"system_prompt": "a\x00b"}, "system_prompt", "Null characters"),
    ({"model": 7}, "model", ""),
    ({}, "title", "give a title, model or system_prompt"),
])
def test_patch_refuses_bad_values_naming_the_field_and_changes_nothing(alice_client, conv, served, body, field, says):
    r = patch(alice_client, conv, {"title": "Renamed", **body} if field != "title" else body)
    assert r.status_code == 400 and field in r.json() and says in r.json()[field][0], r.json()
    conv.refresh_from_db()
    assert (conv.title, conv.model, conv.system_prompt) == ("Sea", "", "")


def test_the_picker_lists_what_is_served(alice_client, served):
    body = alice_client.get("/api/models").json()
    assert body == {"default": None, "models": []}  # no bridge registered: nothing to pick but Default
    assert Client().get("/api/models").status_code in (401, 403)


def test_the_system_prompt_comes_first_and_joins_an_imported_one():
    history = [{"role": "user", "content": "hi"}]
    assert services.with_system_prompt("", history) == history
    assert services.with_system_prompt("Be brief.", history) == [{"role": "system", "content": "Be brief."}, *history]
    imported = [{"role": "system", "content": "You are a pirate."}, *history]
    assert services.with_system_prompt("Be brief.", imported) == [
        {"role": "system", "content": "Be brief.\n\nYou are a pirate."}, *history]


def test_a_turn_renders_the_system_prompt_and_goes_to_the_conversations_model(alice, conv, served):
    services.conversation_configure(conv, model=served.id, system_prompt="Answer in French.")
    turn = services.turn_send(alice, conv.pk, "Where is the sea?")
    assert turn.model == served.id and turn.routes is served.extensions
    assert turn.prompt.index("Answer in French.") < turn.prompt.index("Where is the sea?")
    assert "<|im_start|>system\nAnswer in French.<|im_end|>" in turn.prompt  # ChatML's system turn


def test_a_turn_on_a_model_no_longer_served_is_refused_and_writes_nothing(alice, conv, served, monkeypatch):
    Conversation.objects.filter(pk=conv.pk).update(model="gone-model")
    monkeypatch.setattr(services, "served_model_get", lambda model=None: None if model else served)
    with pytest.raises(services.ChatError) as refused:
        services.turn_send(alice, conv.pk, "hello")
    assert refused.value.code == "model_unavailable" and refused.value.field == "model"
    assert "gone-model" in refused.value.detail and not Message.objects.filter(conversation=conv).exists()


async def test_a_new_chats_first_message_carries_the_picker_choice(alice, fake_bridge, served):
    fake_bridge.script(*reply("Bonjour"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": {},
                             "model": "tiny", "system_prompt": "Answer in French."})
    frames = await frames_until(comm, "done")
    created = frames[0]["conversation"]
    assert created["model"] == served.id and "system_prompt" not in created  # kept out of frames
    stored = await sync_to_async(Conversation.objects.get)(pk=created["id"])
    assert stored.system_prompt == "Answer in French."
    request = fake_bridge.requests[0]
    assert request.model == served.id and "Answer in French." in request.prompt
    await comm.disconnect()


@pytest.mark.parametrize("extra,code,field", [
    ({"model": 3}, "bad_frame", "model"),
    ({"system_prompt": ["x"]}, "bad_frame", "system_prompt"),
    ({"model": "no-such-model"}, "unknown_model", "model"),
    ({"system_prompt": "x" * (SYSTEM_PROMPT_CHARS + 1)}, "bad_system_prompt", "system_prompt"),
])
async def test_a_send_with_a_bad_model_or_system_prompt_is_refused_naming_it(alice, fake_bridge, served,
                                                                             extra, code, field):
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": {}, **extra})
    error = await comm.receive_json_from(timeout=2)
    assert error["type"] == "error" and error["code"] == code and error["field"] == field, error
    assert not await sync_to_async(Conversation.objects.filter(owner=alice).exists)()
    assert not fake_bridge.requests
    await comm.disconnect()
