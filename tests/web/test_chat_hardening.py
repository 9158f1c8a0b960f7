"""Issue 10 on the chat websocket: authorization before subscription, hostile frames answered with
an error frame (never a dropped socket), deactivated users' sockets closed, and sampling values
that cannot reach the engine in a form it refuses."""
import asyncio

import pytest
from asgiref.sync import sync_to_async

from chat import relay, services
from tests.web.fakes import connect, frames_until, reply

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_never_lets_another_user_join_a_live_conversation(alice, bob, fake_bridge, monkeypatch):
    fake_bridge.script(*reply("secret ")[:4], "hang")
    owner = await connect(alice)
    await owner.send_json_to({"type": "send", "conversation": None, "text": "my secret plan"})
    conv_id = (await frames_until(owner, "delta"))[0]["conversation"]["id"]

    # A delta of the owner's stream lands while the intruder's `open` is being checked: a socket
    # that joined the group before the check would receive it.
    check = services.conversation_for

    def racing_check(user, conversation_id, **kw):
        from asgiref.sync import async_to_sync
        async_to_sync(relay.publish)(conv_id, {"type": "delta", "message": 0, "offset": 7, "text": "LEAKED"})
        return check(user, conversation_id, **kw)

    monkeypatch.setattr(services, "conversation_for", racing_check)
    intruder = await connect(bob)
    await intruder.send_json_to({"type": "open", "conversation": conv_id})
    error = await intruder.receive_json_from(timeout=2)
    assert error["type"] == "error" and error["code"] == "not_found"
    await relay.publish(conv_id, {"type": "delta", "message": 0, "offset": 13, "text": "LATER"})
    assert await intruder.receive_nothing(timeout=0.3), "the intruder received the owner's frames"
    await intruder.disconnect()
    await owner.send_json_to({"type": "stop", "conversation": conv_id})
    await frames_until(owner, "done")
    await owner.disconnect()


HOSTILE_FRAMES = [
    ('{"type": "send", "conversation": null, "text": "\\ud800 lone surrogate"}', "text"),
    ('{"type": "send", "conversation": null, "text": "\\u0000"}', "text"),  # PostgreSQL cannot store NUL
    ('{"type": "send", "conversation": null, "text": "a\\u0000b"}', "text"),
    ('{"type": "edit", "conversation": 1, "message": 1, "text": "\\u0000"}', "text"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"temperature": NaN}}', "type"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"temperature": Infinity}}', "type"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"max_tokens": 1e400}}', "params.max_tokens"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"max_tokens": 99999999999}}', "params.max_tokens"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"top_p": -1e-320}}', "params.top_p"),
    ('{"type": "open", "conversation": 100000000000000000000000}', "conversation"),
    ('{"type": {"nested": 1}}', "type"),
    ('{"type": ["send"]}', "type"),
    ('{"type": "send", "conversation": null, "text": ["a"]}', "text"),
    ('{"type": "send", "conversation": null, "text": "hi", "params": {"\\udc00": 1}}', "params.\udc00"),
    ("[" * 5000 + "]" * 5000, "type"),
    ('{"type": "send", "text": "' + "x" * (1 << 20) + '"}', "type"),
]


@pytest.mark.parametrize("raw,field", HOSTILE_FRAMES, ids=range(len(HOSTILE_FRAMES)))
async def test_it_answers_hostile_frames_and_keeps_the_socket(alice, fake_bridge, raw, field):
    fake_bridge.script(*reply("ok"))
    comm = await connect(alice)
    await comm.send_to(text_data=raw)
    error = await comm.receive_json_from(timeout=3)
    assert error["type"] == "error" and error.get("field") == field, error
    assert error["detail"]
    # the socket still works
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hello"})
    assert (await frames_until(comm, "done"))[-1]["message"]["text"] == "ok"
    await comm.disconnect()


@pytest.mark.parametrize("params,sent", [
    ({"temperature": 1e-320}, (0.0, None)),  # top_p not chosen: the served model's default (bridge)
    ({"temperature": 2e-308, "top_p": 1e-320}, (0.0, 1e-6)),
    ({"temperature": 0.123456789, "top_p": 0.99999999}, (0.123457, 1.0)),
])
async def test_it_sends_tiny_sampling_values_in_the_engines_form(alice, fake_bridge, params, sent):
    fake_bridge.script(*reply("ok"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": params})
    await frames_until(comm, "done")
    request = fake_bridge.requests[-1]
    assert (request.temperature, request.top_p) == sent
    await comm.disconnect()


async def test_it_closes_the_sockets_of_a_deactivated_user(alice, fake_bridge):
    comm = await connect(alice)
    other_tab = await connect(alice)
    alice.is_active = False
    await sync_to_async(alice.save)()
    for socket in (comm, other_tab):
        closed = await socket.receive_output(timeout=2)
        assert closed == {"type": "websocket.close", "code": 4401}


async def test_a_deactivated_user_cannot_start_a_turn_even_without_the_broadcast(alice, fake_bridge, django_user_model):
    fake_bridge.script(*reply("should not run"))
    comm = await connect(alice)
    # Deactivated behind the signal's back (e.g. by another process's raw UPDATE).
    await sync_to_async(django_user_model.objects.filter(pk=alice.pk).update)(is_active=False)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    assert await comm.receive_output(timeout=2) == {"type": "websocket.close", "code": 4401}
    await asyncio.sleep(0.1)
    assert fake_bridge.requests == []


async def test_an_open_socket_closes_when_its_user_is_deactivated_by_update(alice, fake_bridge, django_user_model):
    """No frame and no signal: the socket's own periodic check closes it (issue 24)."""
    from chat.consumers import ACCESS_CHECK_S

    comm = await connect(alice)
    await sync_to_async(django_user_model.objects.filter(pk=alice.pk).update)(is_active=False)
    closed = await comm.receive_output(timeout=ACCESS_CHECK_S + 3)
    assert closed == {"type": "websocket.close", "code": 4401}


def _session_for(user):
    from django.contrib.sessions.backends.db import SessionStore
    from django.test import Client

    client = Client()
    client.force_login(user)
    return SessionStore(session_key=client.cookies["sessionid"].value)


@pytest.mark.parametrize("end", ["expire", "delete"])
async def test_an_open_socket_closes_when_its_session_expires_or_is_deleted(alice, fake_bridge, end):
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from chat.consumers import ACCESS_CHECK_S

    session = await sync_to_async(_session_for)(alice)
    comm = await connect(alice, session=session)
    await comm.send_json_to({"type": "open", "conversation": 2 ** 62})
    assert (await comm.receive_json_from(timeout=3))["code"] == "not_found"  # serving
    rows = Session.objects.filter(session_key=session.session_key)
    if end == "expire":
        await sync_to_async(rows.update)(expire_date=timezone.now())
    else:
        await sync_to_async(rows.delete)()
    closed = await comm.receive_output(timeout=ACCESS_CHECK_S + 3)
    assert closed == {"type": "websocket.close", "code": 4401}


async def test_it_passes_the_chosen_expert_count_to_the_engine(alice, fake_bridge):
    fake_bridge.script(*reply("ok"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": {"experts": 12}})
    await frames_until(comm, "done")
    assert fake_bridge.requests[-1].experts == 12
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": {"experts": 0}})
    error = (await frames_until(comm, "error"))[-1]
    assert error["field"] == "params.experts"
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    await frames_until(comm, "done")
    assert fake_bridge.requests[-1].experts is None  # the model's own default
    await comm.disconnect()


async def test_a_final_save_that_fails_once_is_retried(alice, fake_bridge, monkeypatch):
    fake_bridge.script(*reply("kept"))
    monkeypatch.setattr(relay, "SAVE_RETRY_DELAYS", (0.0, 0.0))
    real, calls = services.message_finish, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database restarting")
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "message_finish", flaky)
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hello"})
    frames = await frames_until(comm, "done")
    assert frames[-1]["message"]["text"] == "kept" and len(calls) == 2
    assert not [f for f in frames if f["type"] == "error"]
    stored = await sync_to_async(lambda: services.Message.objects.get(pk=frames[-1]["message"]["id"]).text)()
    assert stored == "kept"
    await comm.disconnect()


async def test_a_reply_the_database_never_takes_still_reaches_the_reader_with_an_explanation(alice, fake_bridge, monkeypatch):
    fake_bridge.script(*reply("only on screen"))
    monkeypatch.setattr(relay, "SAVE_RETRY_DELAYS", (0.0, 0.0))

    def down(*args, **kwargs):
        raise ConnectionError("database down")

    monkeypatch.setattr(services, "message_finish", down)
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hello"})
    frames = await frames_until(comm, "done")
    error = next(f for f in frames if f["type"] == "error")
    assert error["code"] == "SAVE_FAILED" and "could not be saved" in error["detail"]
    assert frames[-1]["message"]["text"] == "only on screen" and frames[-1]["message"]["status"] == "complete"
    await comm.disconnect()
