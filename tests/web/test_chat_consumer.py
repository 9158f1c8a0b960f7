"""The chat websocket with channels' WebsocketCommunicator and a scripted bridge."""
import asyncio

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from chat.consumers import ChatConsumer
from chat.models import Message
from tests.web.fakes import connect, frames_until, reply

pytestmark = pytest.mark.django_db(transaction=True)


async def test_it_refuses_anonymous_users():
    from django.contrib.auth.models import AnonymousUser

    comm = WebsocketCommunicator(ChatConsumer.as_asgi(), "/ws/chat/")
    comm.scope["user"] = AnonymousUser()
    connected, _ = await comm.connect()
    assert connected  # accepted only to say why: close code 4401
    assert await comm.receive_output(timeout=1) == {"type": "websocket.close", "code": 4401}


async def test_it_refuses_foreign_origins():
    from colibri_site.asgi import application

    comm = WebsocketCommunicator(application, "/ws/chat/", headers=[(b"origin", b"http://evil.example"), (b"host", b"127.0.0.1")])
    connected, _ = await comm.connect()
    assert not connected


@pytest.mark.parametrize("frame,field", [
    ({"type": "dance"}, "type"),
    ({"type": "send", "conversation": None, "text": "   "}, "text"),
    ({"type": "send", "conversation": "1", "text": "hi"}, "conversation"),
    ({"type": "send", "conversation": None, "text": "hi", "params": {"temperature": 5}}, "params.temperature"),
    ({"type": "send", "conversation": None, "text": "hi", "params": {"top_p": 0}}, "params.top_p"),
    ({"type": "send", "conversation": None, "text": "hi", "params": {"max_tokens": 1.5}}, "params.max_tokens"),
    ({"type": "send", "conversation": None, "text": "hi", "params": {"bogus": 1}}, "params.bogus"),
    ({"type": "edit", "conversation": 1, "message": True, "text": "x"}, "message"),
    (["not", "an", "object"], "type"),
])
async def test_it_answers_bad_frames_with_an_error_naming_the_field(alice, fake_bridge, frame, field):
    comm = await connect(alice)
    await comm.send_json_to(frame)
    error = await comm.receive_json_from(timeout=2)
    assert error["type"] == "error" and error["field"] == field, error
    # the socket survives
    await comm.send_to(text_data="{not json")
    assert (await comm.receive_json_from(timeout=2))["code"] == "bad_frame"
    await comm.send_to(bytes_data=b"\x00")
    assert (await comm.receive_json_from(timeout=2))["code"] == "bad_frame"
    await comm.disconnect()


async def test_it_streams_a_reply(alice, fake_bridge):
    fake_bridge.script(*reply("Hel", "lo", "!"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi", "params": {"temperature": 0}})
    frames = await frames_until(comm, "done")
    kinds = [f["type"] for f in frames]
    assert kinds[:3] == ["conversation", "message", "message"]
    assert "queued" in kinds and "started" in kinds
    deltas = [f for f in frames if f["type"] == "delta"]
    text = ""
    for d in deltas:
        assert d["offset"] == len(text)
        text += d["text"]
    assert text == "Hello!"
    final = frames[-1]["message"]
    assert final["status"] == "complete" and final["text"] == "Hello!"
    assert final["stats"]["completion_tokens"] == 2 and final["stats"]["finish_reason"] == "stop"
    req = fake_bridge.requests[0]
    assert req.temperature == 0 and req.conversation_key == f"conv:{frames[0]['conversation']['id']}"
    await comm.disconnect()


async def test_stop_interrupts_and_keeps_partial_text_and_reload_shows_it(alice, fake_bridge):
    fake_bridge.script(*reply("partial ", "text")[:5], "hang")
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    frames = await frames_until(comm, "delta")
    conv_id = frames[0]["conversation"]["id"]
    await asyncio.wait_for(fake_bridge.hanging.wait(), 3)
    await comm.disconnect()  # closing the tab does not stop the turn

    comm2 = await connect(alice)
    await comm2.send_json_to({"type": "open", "conversation": conv_id})
    snap = await comm2.receive_json_from(timeout=2)
    assert snap["type"] == "snapshot"
    assert snap["messages"][-1]["status"] == "streaming" and snap["messages"][-1]["text"] == "partial text"

    await comm2.send_json_to({"type": "stop", "conversation": conv_id})
    done = (await frames_until(comm2, "done"))[-1]["message"]
    assert done["status"] == "interrupted" and done["text"] == "partial text"
    assert fake_bridge.cancelled, "the engine request was not cancelled"
    await comm2.disconnect()


async def test_an_engine_error_keeps_partial_text_and_tells_the_user(alice, fake_bridge):
    fake_bridge.script(*reply("half")[:4], {"kind": "error", "code": "ENGINE_DIED", "message": "exit 139"})
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    frames = await frames_until(comm, "done")
    error = next(f for f in frames if f["type"] == "error")
    assert error["code"] == "ENGINE_DIED" and "engine stopped" in error["detail"]
    final = frames[-1]["message"]
    assert final["status"] == "interrupted" and final["text"] == "half" and "ENGINE_DIED" in final["stats"]["error"]
    await comm.disconnect()


async def test_regenerate_and_edit_publish_a_snapshot(alice, fake_bridge):
    fake_bridge.script(*reply("one"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    frames = await frames_until(comm, "done")
    conv_id = frames[0]["conversation"]["id"]
    await comm.send_json_to({"type": "regenerate", "conversation": conv_id, "params": {}})
    frames = await frames_until(comm, "done")
    assert frames[0]["type"] == "snapshot" and [m["role"] for m in frames[0]["messages"]] == ["user", "assistant"]
    user_id = frames[0]["messages"][0]["id"]
    await comm.send_json_to({"type": "edit", "conversation": conv_id, "message": user_id, "text": "edited"})
    frames = await frames_until(comm, "done")
    assert frames[0]["messages"][0]["text"] == "edited"
    count = await sync_to_async(Message.objects.filter(conversation_id=conv_id).count)()
    assert count == 2
    await comm.disconnect()


async def test_it_validates_ownership(alice, bob, fake_bridge):
    fake_bridge.script(*reply("x"))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "secret"})
    conv_id = (await frames_until(comm, "done"))[0]["conversation"]["id"]
    intruder = await connect(bob)
    for frame in ({"type": "open", "conversation": conv_id}, {"type": "stop", "conversation": conv_id},
                  {"type": "send", "conversation": conv_id, "text": "x"}):
        await intruder.send_json_to(frame)
        error = await intruder.receive_json_from(timeout=2)
        assert error["type"] == "error" and error["code"] == "not_found"
    await comm.disconnect()
    await intruder.disconnect()
