"""The chat websocket end to end: a real websocket client against Daphne + bridge + engine."""
import asyncio
import json

import pytest
import websockets
from asgiref.sync import sync_to_async
from django.test import Client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_cookie(alice):
    c = Client()
    c.force_login(alice)  # committed (transactional_db): Daphne reads the same session row
    return f"sessionid={c.cookies['sessionid'].value}"


def connect(live_stack, cookie):
    return websockets.connect(live_stack.ws_url + "/ws/chat/", origin=live_stack.url,
                              additional_headers={"Cookie": cookie}, open_timeout=10)


async def recv_until(ws, kind, timeout=30):
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        frames.append(frame)
        if frame["type"] == kind:
            return frames


async def test_it_refuses_anonymous_sockets(live_stack):
    async with websockets.connect(live_stack.ws_url + "/ws/chat/", origin=live_stack.url) as ws:
        with pytest.raises(websockets.ConnectionClosed) as exc:
            await asyncio.wait_for(ws.recv(), 5)
    assert exc.value.rcvd.code == 4401


async def test_send_streams_and_completes(live_stack, session_cookie):
    async with connect(live_stack, session_cookie) as ws:
        await ws.send(json.dumps({"type": "send", "conversation": None, "text": "Hello there",
                                  "params": {"max_tokens": 32, "temperature": 0}}))
        frames = await recv_until(ws, "done")
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "conversation" and "started" in kinds and "delta" in kinds, kinds
    text = "".join(f["text"] for f in frames if f["type"] == "delta")
    final = frames[-1]["message"]
    assert final["status"] == "complete" and final["text"] == text
    assert final["stats"]["completion_tokens"] <= 32 and final["stats"]["tok_s"]


async def test_stop_keeps_partial_text_and_reload_shows_it(live_stack, session_cookie):
    from chat.models import Message

    async with connect(live_stack, session_cookie) as ws:
        # 120k tokens take ~10 s even on the fixture model: the turn is still running when we stop it.
        await ws.send(json.dumps({"type": "send", "conversation": None, "text": "Write a long story",
                                  "params": {"max_tokens": 120000, "temperature": 0}}))
        frames = await recv_until(ws, "delta")
        conv_id = frames[0]["conversation"]["id"]
    # The tab is gone; the turn goes on and its text so far is saved (every 0.5 s). A new socket
    # then opens the conversation.
    deadline = asyncio.get_running_loop().time() + 15
    while not await sync_to_async(
            Message.objects.filter(conversation_id=conv_id, role="assistant").exclude(text="").exists)():
        assert asyncio.get_running_loop().time() < deadline, "the partial reply was never saved"
        await asyncio.sleep(0.1)
    async with connect(live_stack, session_cookie) as ws:
        await ws.send(json.dumps({"type": "open", "conversation": conv_id}))
        snap = (await recv_until(ws, "snapshot"))[-1]
        reply = snap["messages"][-1]
        assert reply["role"] == "assistant" and reply["status"] == "streaming" and reply["text"]
        live = await recv_until(ws, "delta")  # and it continues live
        assert live[-1]["offset"] >= len(reply["text"]) - len(live[-1]["text"])
        await ws.send(json.dumps({"type": "stop", "conversation": conv_id}))
        final = (await recv_until(ws, "done"))[-1]["message"]
    assert final["status"] == "interrupted" and final["text"].startswith(reply["text"])
    stored = await sync_to_async(Message.objects.get)(pk=final["id"])
    assert stored.status == "interrupted" and stored.text == final["text"]
    deadline = asyncio.get_running_loop().time() + 3
    while live_stack.bridge_state().get("busy") and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert not live_stack.bridge_state().get("busy")


async def wait_up(live_stack, timeout=60):
    deadline = asyncio.get_running_loop().time() + timeout
    while not (live_stack.bridge_state().get("up") and live_stack.engine_pid()):
        assert asyncio.get_running_loop().time() < deadline, "the bridge did not restart the engine"
        await asyncio.sleep(0.1)


async def test_engine_killed_mid_stream_keeps_the_partial_reply_and_recovers(live_stack, session_cookie):
    import os
    import signal

    from chat.models import Message

    await wait_up(live_stack)
    async with connect(live_stack, session_cookie) as ws:
        await ws.send(json.dumps({"type": "send", "conversation": None, "text": "Write a long story",
                                  "params": {"max_tokens": 15000, "temperature": 0}}))
        frames = await recv_until(ws, "delta")
        conv_id = frames[0]["conversation"]["id"]
        os.kill(live_stack.engine_pid(), signal.SIGKILL)
        frames = await recv_until(ws, "done")
        errors = [f for f in frames if f["type"] == "error"]
        assert errors and errors[0]["code"] == "ENGINE_DIED", frames[-3:]
        assert "engine" in errors[0]["detail"].lower()
        final = frames[-1]["message"]
        assert final["status"] == "interrupted" and final["text"], "the partial reply was not kept"
        stored = await sync_to_async(Message.objects.get)(pk=final["id"])
        assert stored.status == "interrupted" and stored.text == final["text"]
        assert "ENGINE_DIED" in stored.stats.get("error", "")

        await wait_up(live_stack)
        await ws.send(json.dumps({"type": "send", "conversation": conv_id, "text": "Again, shorter",
                                  "params": {"max_tokens": 8, "temperature": 0}}))
        after = (await recv_until(ws, "done"))[-1]["message"]
    assert after["status"] == "complete" and after["stats"]["completion_tokens"] >= 1
