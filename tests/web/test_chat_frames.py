"""The chat socket's server frames in one funnel (chat/server_frames.py) and the front end's type
of them: the generated ServerEvent union must be what the declarations say, the hand-written
Message / Conversation interfaces must declare every key the server sends, every frame-building
path must go through the funnel, and a reasoning model's thinking streams as `thinking` frames, is
stored and exported with its message, and never goes back into the next turn's prompt."""
import json
from pathlib import Path

import pytest
from django.utils import timezone

from chat import server_frames
from chat.models import Conversation, Message
from colibri_base.frames import COMMAND, interface_keys
from tests.support.frames import hand_built_frames
from tests.web.fakes import connect, done_event, frames_until

ROOT = Path(__file__).resolve().parents[2]
TARGET = server_frames.FRAME_SET.target


def test_the_front_ends_server_event_type_is_generated_from_the_declarations():
    on_disk = (ROOT / TARGET).read_text()
    assert on_disk == server_frames.typescript(), (
        f"{TARGET} is stale: run `{COMMAND}` (then `npm run build` in frontend/)")
    # The drift this replaced: error frames carry field and ref, the hand-written union had neither.
    error_line = next(line for line in on_disk.splitlines() if '"error"' in line)
    assert "field?: string" in error_line and "ref?: string" in error_line


@pytest.mark.parametrize("data,ts_name", list(server_frames.TS_NAMES.items()))
def test_the_hand_written_interfaces_declare_every_key_the_server_sends(data, ts_name):
    ts_file = server_frames.FRAME_SET.ts_files[ts_name]
    ts = interface_keys((ROOT / ts_file).read_text(), ts_name)
    assert ts is not None, f"{ts_file} declares no interface {ts_name}"
    missing = [k for k in data.__annotations__ if k not in ts]
    assert missing == [], f"{ts_file} {ts_name} lacks {missing}"
    # A key the server always sends may be optional in TS (older rows, messages built on the page);
    # a key TS requires must be one the server always sends.
    required_in_ts = {k for k, optional in ts.items() if not optional}
    server_keys = set(data.__annotations__)
    assert required_in_ts - server_keys <= {"system_prompt"}, required_in_ts - server_keys  # HTTP detail only


def test_the_models_dicts_have_exactly_the_declared_keys():
    now = timezone.now()
    msg = Message(pk=1, conversation_id=2, role="assistant", created=now)
    conv = Conversation(pk=2, owner_id=1, created=now, updated=now)
    assert set(msg.as_dict()) == set(server_frames.MessageData.__annotations__)
    assert set(conv.as_data()) == set(server_frames.ConversationData.__annotations__)
    assert server_frames.problems(server_frames.message(msg.as_dict())) == []
    assert server_frames.problems(server_frames.conversation(conv.as_data())) == []


def test_the_conformance_check_finds_what_differs():
    ok = server_frames.error(None, "bad_frame", "no", "text", "ab12cd34")
    assert server_frames.problems(ok) == []
    assert server_frames.problems({**ok, "hint": 1}) == ["error.hint: not declared"]
    assert server_frames.problems({"type": "delta", "message": 1, "offset": "0", "text": "x"}) == [
        "delta.offset: '0' is not number"]
    assert server_frames.problems({"type": "started", "message": 1}) == ["started.prompt_tokens: missing"]
    assert server_frames.problems({"type": "queued", "message": True, "position": 1}) == [
        "queued.message: True is not number"]
    assert server_frames.problems({"type": "nope"}) == ["unknown frame type 'nope'"]


def test_the_chat_app_builds_server_frames_only_through_the_funnel():
    """A dict literal whose "type" is a server frame's type, anywhere in chat/ but the funnel, is a
    frame built by hand (the layer's own {"type": "chat.frame"} envelopes are not frames)."""
    assert hand_built_frames(server_frames) == []


# --- thinking through the socket (engine_bridge.client.generate played by tests.web.fakes) --------

def thinking_reply(thoughts, answer, reasoning_tokens=3):
    """What the bridge yields for a reasoning model: `reasoning` events, then `text` (the answer)."""
    done = done_event(completion_tokens=5)
    done["reasoning_tokens"] = reasoning_tokens
    return ([{"kind": "queued", "position": 1}, {"kind": "accepted", "prompt_tokens": 7, "slot": 0}]
            + [{"kind": "reasoning", "text": t} for t in thoughts] + [{"kind": "text", "text": t} for t in answer]
            + [done])


@pytest.mark.django_db(transaction=True)
async def test_thinking_streams_apart_from_the_answer_and_never_goes_back_into_the_prompt(alice, fake_bridge):
    fake_bridge.script(*thinking_reply(["The user ", "greets; <b>greet</b> back."], ["Hel", "lo!"]))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    frames = await frames_until(comm, "done")
    conv_id = frames[0]["conversation"]["id"]
    thought = answer = ""
    for f in frames:
        if f["type"] == "thinking":
            assert f["offset"] == len(thought) and answer == ""  # all thinking came before the answer
            thought += f["text"]
        elif f["type"] == "delta":
            assert f["offset"] == len(answer)
            answer += f["text"]
    assert (thought, answer) == ("The user greets; <b>greet</b> back.", "Hello!")
    final = frames[-1]["message"]
    assert final["text"] == "Hello!" and final["thinking"] == thought
    assert final["stats"]["reasoning_tokens"] == 3 and final["stats"]["thinking_s"] >= 0
    stored = await Message.objects.aget(pk=final["id"])
    assert (stored.text, stored.thinking) == ("Hello!", thought)

    # The snapshot a reload reads has it; the next turn's prompt has the answer, not the thinking.
    await comm.send_json_to({"type": "open", "conversation": conv_id})
    snap = (await frames_until(comm, "snapshot"))[-1]
    assert snap["messages"][-1]["thinking"] == thought
    fake_bridge.script(*thinking_reply(["again"], ["Bye."]))
    await comm.send_json_to({"type": "send", "conversation": conv_id, "text": "bye"})
    await frames_until(comm, "done")
    prompt = fake_bridge.requests[-1].prompt
    assert "Hello!" in prompt and "greets" not in prompt and "The user" not in prompt
    await comm.disconnect()


@pytest.mark.django_db(transaction=True)
async def test_a_reply_stopped_while_thinking_keeps_its_thinking(alice, fake_bridge):
    fake_bridge.script({"kind": "accepted", "prompt_tokens": 7, "slot": 0}, {"kind": "reasoning", "text": "Hmm, "},
                       {"kind": "reasoning", "text": "let me see"}, "hang")
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    frames = await frames_until(comm, "thinking")
    conv_id = frames[0]["conversation"]["id"]
    await comm.send_json_to({"type": "stop", "conversation": conv_id})
    final = (await frames_until(comm, "done"))[-1]["message"]
    assert final["status"] == "interrupted" and final["text"] == "" and final["thinking"] == "Hmm, let me see"
    await comm.disconnect()


def test_the_export_keeps_the_thinking(alice_client, alice):
    conv = Conversation.objects.create(owner=alice, title="Think")
    Message.objects.create(conversation=conv, role="user", text="2+2?")
    Message.objects.create(conversation=conv, role="assistant", text="4", thinking="Two and two make four.")
    data = json.loads(alice_client.get("/conversations/export?format=json").content)
    reply = data["conversations"][0]["messages"][1]
    assert (reply["text"], reply["thinking"]) == ("4", "Two and two make four.")
    md = alice_client.get("/conversations/export?format=md").content.decode()
    assert "<summary>Thinking</summary>\n\nTwo and two make four.\n\n</details>\n\n4" in md
    assert md.count("<summary>Thinking") == 1  # the user turn has none


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("template,mode", [
    ("", None),  # the default ChatML template: no reasoning format, all output is answer
    ("{% for m in messages %}{{ m.content.split('</think>')[-1] }}{% endfor %}", "think"),
])
async def test_the_turn_asks_the_bridge_for_its_models_reasoning_format(alice, fake_bridge, settings, template, mode):
    settings.CHAT_TEMPLATE = template
    fake_bridge.script(*thinking_reply([], ["ok"]))
    comm = await connect(alice)
    await comm.send_json_to({"type": "send", "conversation": None, "text": "hi"})
    await frames_until(comm, "done")
    assert fake_bridge.requests[0].reasoning == mode
    await comm.disconnect()
