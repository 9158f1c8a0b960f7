"""Per message (issue 13 item 4): a chat reply keeps which experts answered it (the bridge's
done.routing, asked with routes=True), staff read it at /atlas/api/messages/<id>/routing (the
atlas page's ?message= filter), the chat page tells the script whether to link to it."""
import asyncio
import json

import pytest

from chat import relay
from chat.models import Conversation, Message
from chat.services import message_finish, routing_pack, routing_phases_unpack, routing_unpack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_bridge")]
ROUTING = {"rows": 4, "cols": 8, "counts": [[0, 1, 12], [0, 5, 3], [3, 7, 40]]}
# As the bridge splits a reasoning turn (engine_bridge.route_phases): the phases add up to counts.
PHASED = {**ROUTING, "phases": {"prompt": [[0, 1, 10], [3, 7, 30]], "thinking": [[0, 1, 2], [3, 7, 6]],
                                "answer": [[0, 5, 3], [3, 7, 4]]},
          "positions": {"prompt": 20, "thinking": 4, "answer": 3}}


def _stored(user, routing=ROUTING):
    """An assistant message stored as the chat relay stores one (chat.services.message_finish)."""
    conv = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conv, role="user", text="hi")
    msg = Message.objects.create(conversation=conv, role="assistant", status="streaming")
    return message_finish(msg.pk, text="hello", status="complete", stats={"hit_pct": 87.5}, routing=routing)


def test_staff_read_a_messages_routing(staff, staff_client):
    msg = _stored(staff)
    response = staff_client.get(f"/atlas/api/messages/{msg.pk}/routing")
    assert response.status_code == 200
    body = response.json()
    assert body == {"message": msg.pk, "conversation": msg.conversation_id, "role": "assistant",
                    "rows": 4, "cols": 8, "counts": ROUTING["counts"], "experts": 3, "selections": 55, "io": None,
                    "phases": None}
    assert "text" not in body
    assert "routing" not in msg.as_dict()  # kept off the chat socket


def test_members_and_strangers_cannot_read_routing(staff, member_client, client):
    msg = _stored(staff)
    assert member_client.get(f"/atlas/api/messages/{msg.pk}/routing").status_code == 403
    assert client.get(f"/atlas/api/messages/{msg.pk}/routing").status_code == 401


def test_routing_of_a_missing_or_unrouted_message_is_404(staff, staff_client):
    msg = _stored(staff, routing=None)
    missing = staff_client.get("/atlas/api/messages/999999/routing")
    assert missing.status_code == 404 and missing.json() == {"error": "no such message"}
    unrouted = staff_client.get(f"/atlas/api/messages/{msg.pk}/routing")
    assert unrouted.status_code == 404 and "no routing" in unrouted.json()["error"]


def _boot(response):
    html = response.content.decode()
    start = html.index('id="colibri-boot"')
    return json.loads(html[html.index(">", start) + 1:html.index("</script>", start)])


def test_the_chat_page_tells_the_script_who_is_staff(staff_client, member_client):
    assert _boot(staff_client.get("/"))["is_staff"] is True
    assert _boot(member_client.get("/"))["is_staff"] is False


def _relayed(user, routing=ROUTING, io=None):
    """An assistant turn relayed to its end by chat.relay with a done event carrying `routing`
    (and `io`, the turn's IOSTAT figures, when given)."""
    conv = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conv, role="user", text="hi")
    msg = Message.objects.create(conversation=conv, role="assistant", status="streaming")
    state = relay._State()
    done = {"kind": "done", "finish_reason": "stop", "usage": {"prompt_tokens": 5, "completion_tokens": 2},
            "stats": {"tok_s": 10.0, "hit_pct": 87.5, "ttft_s": 0.1}, "routing": routing, "io": io}
    asyncio.run(relay._handle(conv.pk, msg.pk, done, state))
    asyncio.run(relay._finish(conv.pk, msg.pk, state))
    msg.refresh_from_db()
    return msg


def test_a_relayed_reply_keeps_the_experts_that_answered_it(staff, monkeypatch):
    frames = []

    async def publish(conv_id, frame):
        frames.append(frame)
    monkeypatch.setattr(relay, "publish", publish)
    msg = _relayed(staff)
    assert routing_unpack(msg.routing) == ROUTING["counts"]
    assert msg.stats["experts_routed"] == 3 and msg.stats["hit_pct"] == 87.5
    done = [f for f in frames if f["type"] == "done"][0]
    assert "routing" not in done["message"] and done["message"]["stats"]["experts_routed"] == 3


def test_a_replys_turn_io_is_kept_and_served_with_its_routing(staff, staff_client, monkeypatch):
    from engine_bridge import protocol

    monkeypatch.setattr(relay, "publish", lambda *a: asyncio.sleep(0))
    io = protocol.IoStat(3, 9, 900, 450, 7, 8, 0.009, 2, 1).figures()
    msg = _relayed(staff, io=io)
    assert msg.stats["io"] == io
    body = staff_client.get(f"/atlas/api/messages/{msg.pk}/routing").json()
    assert body["io"] == io and body["counts"] == ROUTING["counts"]
    assert "io" not in _relayed(staff).stats  # an engine without IOSTAT: nothing stored


def test_a_reply_without_routing_has_no_count(staff, monkeypatch):
    monkeypatch.setattr(relay, "publish", lambda *a: asyncio.sleep(0))
    msg = _relayed(staff, routing=None)
    assert msg.routing is None and "experts_routed" not in msg.stats


def test_chat_asks_for_routes_only_from_an_engine_that_takes_them():
    assert relay.engine_reports_routes({"name": "tiny", "top_k": 2})  # our engine's MODEL line
    assert not relay.engine_reports_routes({"name": "glm", "extensions": False})  # the real colibri
    assert not relay.engine_reports_routes(None)  # no engine up
    request = relay._generation_request(7, "prompt", {}, routes=True)
    assert request.routes is True and request.heat is True
    assert relay._generation_request(7, "prompt", {}).routes is False


def test_routing_is_kept_packed_and_unpacks_exactly():
    packed = routing_pack(ROUTING)
    assert packed["dtype"] == "u16" and packed["experts"] == 3 and packed["selections"] == 55
    assert routing_unpack(packed) == ROUTING["counts"]
    big = routing_pack({"rows": 78, "cols": 256, "counts": [[77, 255, 70000], [0, 0, 1]]})
    assert big["dtype"] == "u32" and routing_unpack(big) == [[0, 0, 1], [77, 255, 70000]]
    assert len(big["counts_b64"]) == 106_496  # 78 x 256 x 4 bytes in base64
    assert routing_pack(None) is None and routing_pack({"rows": 4, "cols": 8, "counts": []}) is None


def test_phases_are_kept_packed_and_served_in_turn_order(staff, staff_client, monkeypatch):
    packed = routing_pack(PHASED)
    assert list(packed["phases"]) == ["prompt", "thinking", "answer"]
    assert {k: (v["experts"], v["selections"], v["positions"]) for k, v in packed["phases"].items()} == {
        "prompt": (2, 40, 20), "thinking": (2, 8, 4), "answer": (2, 7, 3)}
    assert routing_phases_unpack(packed) == {
        name: {"counts": PHASED["phases"][name], "experts": 2, "selections": sel, "positions": PHASED["positions"][name]}
        for name, sel in (("prompt", 40), ("thinking", 8), ("answer", 7))}
    assert routing_phases_unpack(routing_pack(ROUTING)) is None  # an engine without per-token routing
    plain = routing_pack({**ROUTING, "phases": {"prompt": [[0, 1, 12]], "answer": [[0, 5, 3], [3, 7, 40]]},
                          "positions": {"prompt": 6, "answer": 20}})
    assert list(plain["phases"]) == ["prompt", "answer"]  # a model without reasoning: no thinking
    # a phase outside the map is dropped, the turn's counts are kept
    bad = routing_pack({**PHASED, "phases": {"prompt": [[4, 0, 1]]}})
    assert "phases" not in bad and routing_unpack(bad) == ROUTING["counts"]

    monkeypatch.setattr(relay, "publish", lambda *a: asyncio.sleep(0))
    msg = _relayed(staff, routing=PHASED)
    body = staff_client.get(f"/atlas/api/messages/{msg.pk}/routing").json()
    assert list(body["phases"]) == ["prompt", "thinking", "answer"]
    assert body["phases"]["thinking"] == {"counts": [[0, 1, 2], [3, 7, 6]], "experts": 2, "selections": 8, "positions": 4}
    assert body["counts"] == ROUTING["counts"] and msg.stats["experts_routed"] == 3


def test_a_reply_with_a_nul_is_stored(staff):
    """The fixture model emitted a NUL once: the final save failed and the reply hung (test_csp)."""
    conv = Conversation.objects.create(owner=staff)
    msg = Message.objects.create(conversation=conv, role="assistant", status="streaming")
    from chat.services import message_save_partial

    message_save_partial(msg.pk, "a\x00b")
    msg.refresh_from_db()
    assert msg.text == "a\ufffdb"
    done = message_finish(msg.pk, text="a\x00b\x00", status="complete", stats={}, routing=ROUTING)
    done.refresh_from_db()
    assert done.text == "a\ufffdb\ufffd" and done.status == "complete"
