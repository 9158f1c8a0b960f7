"""Per message (issue 13 item 4): a chat reply keeps which experts answered it (the bridge's
done.routing, asked with routes=True), staff read it at /atlas/api/messages/<id>/routing (the
atlas page's ?message= filter), the chat page tells the script whether to link to it."""
import json

import pytest

from chat.models import Conversation, Message
from chat.services import message_finish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_bridge")]
ROUTING = {"rows": 4, "cols": 8, "counts": [[0, 1, 12], [0, 5, 3], [3, 7, 40]]}


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
                    "rows": 4, "cols": 8, "counts": ROUTING["counts"], "experts": 3, "selections": 55}
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
