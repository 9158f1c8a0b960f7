"""Per message (issue 13 item 4) on the real stack: Daphne + bridge + native engine (fixture
model, 4 MoE layers x 8 experts). A staff user's reply shows "expert hits" as a link; it opens
/atlas?message=<id> in a new tab, which fetches that message's routing, says "message N: K
experts" with K the experts the engine reported for it, paints those cells and dims the rest;
its phase buttons (the engine's per-token routing) show the prompt's or the answer's experts
alone; Clear filter removes it. A member's reply shows the same stat as plain text: no link."""
import pytest

from chat.models import Conversation, Message
from chat.services import message_finish, message_routing
from tests.browser.conftest import PASSWORD, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
REPLY = ".msg-assistant[data-id]"
FINISHED = ("sel => { const r = [...document.querySelectorAll(sel)].pop(); "
            "return r && r.dataset.status && r.dataset.status !== 'streaming'; }")


# As the bridge splits a reasoning turn (engine_bridge.route_phases) on the fixture's 4 x 8 map.
PHASED = {"rows": 4, "cols": 8, "counts": [[0, 1, 12], [0, 5, 3], [3, 6, 2], [3, 7, 40]],
          "phases": {"prompt": [[0, 1, 10], [3, 7, 30]], "thinking": [[0, 1, 2], [3, 7, 6]],
                     "answer": [[0, 5, 3], [3, 6, 2], [3, 7, 4]]},
          "positions": {"prompt": 20, "thinking": 4, "answer": 3}}


def _stored_reply(user, routing):
    conv = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conv, role="user", text="2 + 2?")
    msg = Message.objects.create(conversation=conv, role="assistant", status="streaming")
    return message_finish(msg.pk, text="4", thinking="Two and two.", status="complete", stats={}, routing=routing).pk


def chat_turn(page, text):
    """Sends one message and returns the finished reply's locator and message id."""
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    page.fill(".composer-input", text)
    page.keyboard.press("Enter")
    page.wait_for_function(FINISHED, arg=REPLY, timeout=60000)
    reply = page.locator(REPLY).last
    assert reply.get_attribute("data-status") == "complete"
    return reply, int(reply.get_attribute("data-id"))


def test_a_staff_reply_links_to_the_experts_that_answered_it(live_stack, browser, django_user_model):
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    django_user_model.objects.create_user("mia", password=PASSWORD)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    errors = []
    chat = context.new_page()
    chat.set_default_timeout(15000)
    chat.on("pageerror", lambda e: errors.append(str(e)))
    log_in(chat, live_stack.url, "sam")
    reply, msg_id = chat_turn(chat, "Which experts answer this?")

    routing = message_routing(msg_id)  # what the engine reported for this reply, as the chat kept it
    assert routing["counts"] and routing["rows"] == 4 and routing["cols"] == 8, routing
    experts = len(routing["counts"])
    assert experts == routing["experts"] == Message.objects.get(pk=msg_id).stats["experts_routed"]
    link = reply.locator("a.stat-link")
    assert link.count() == 1 and "expert hits" in link.inner_text()
    assert link.get_attribute("href") == f"/atlas?message={msg_id}"

    screenshot(chat, "chat-expert-hits-link")
    with context.expect_page() as opened:
        link.click()
    atlas = opened.value
    atlas.on("pageerror", lambda e: errors.append(str(e)))
    atlas.wait_for_function("() => { const a = window.colibriAtlas; return a && a.grid.filter && a.grid.filter.size > 0; }",
                            timeout=30000)
    assert atlas.url.endswith(f"/atlas?message={msg_id}")
    text = atlas.inner_text("#filter-text")
    assert text.startswith(f"message {msg_id}: {experts} experts"), text
    assert atlas.evaluate("window.colibriAtlas.grid.filter.size") == experts
    first_row, first_expert, first_count = routing["counts"][0]
    cell = first_row * 8 + first_expert
    assert atlas.evaluate(f"window.colibriAtlas.grid.filter.get({cell})") == first_count
    screenshot(atlas, "atlas-message-filter")
    # The turn split by phase (the engine's per-token routing): a model without reasoning has a
    # prompt and an answer; a phase's button shows that phase's experts alone.
    phases = routing["phases"]
    assert list(phases) == ["prompt", "answer"], phases
    buttons = atlas.locator("#filter-phases button")
    assert [b.get_attribute("data-phase") for b in buttons.all()] == ["all", "prompt", "answer"]
    assert buttons.first.get_attribute("aria-pressed") == "true"
    answer = phases["answer"]
    atlas.click("#filter-phases button[data-phase=answer]")
    assert atlas.get_attribute("#filter-phases button[data-phase=answer]", "aria-pressed") == "true"
    assert atlas.inner_text("#filter-text").startswith(
        f"message {msg_id} · answer: {answer['experts']} experts · {answer['selections']} selections over {answer['positions']} tokens")
    assert atlas.evaluate("window.colibriAtlas.grid.filter.size") == answer["experts"]
    row, expert, count = answer["counts"][-1]
    assert atlas.evaluate(f"window.colibriAtlas.grid.filter.get({row * 8 + expert})") == count
    assert atlas.locator("#filter-overlap").is_hidden()  # no thinking to compare with
    screenshot(atlas, "atlas-message-filter-answer")
    atlas.click("#filter-phases button[data-phase=all]")
    assert atlas.evaluate("window.colibriAtlas.grid.filter.size") == experts
    atlas.click("#filter-clear")
    assert atlas.evaluate("window.colibriAtlas.grid.filter") is None
    assert atlas.locator("#atlas-filter").is_hidden() and atlas.url.endswith("/atlas")

    # A reasoning model's reply (kept as the relay keeps one; the fixture model never thinks):
    # a thinking button, and the experts only thinking / only answering / in both.
    thought = _stored_reply(django_user_model.objects.get(username="sam"), PHASED)
    atlas.goto(f"{live_stack.url}/atlas?message={thought}")
    atlas.wait_for_function("() => { const a = window.colibriAtlas; return a && a.grid.filter && a.grid.filter.size > 0; }",
                            timeout=30000)
    assert [b.get_attribute("data-phase") for b in atlas.locator("#filter-phases button").all()] == [
        "all", "prompt", "thinking", "answer"]
    assert atlas.inner_text("#filter-overlap") == "Experts only while thinking: 1 · only while answering: 2 · in both: 1"
    atlas.click("#filter-phases button[data-phase=thinking]")
    assert atlas.inner_text("#filter-text").startswith(f"message {thought} · thinking: 2 experts · 8 selections over 4 tokens")
    assert atlas.evaluate("[...window.colibriAtlas.grid.filter.entries()]") == [[1, 2], [31, 6]]
    screenshot(atlas, "atlas-message-filter-thinking")
    assert not errors, errors
    context.close()

    # A member: the same stat, as plain text.
    member = browser.new_context(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    page = member.new_page()
    page.set_default_timeout(15000)
    log_in(page, live_stack.url, "mia")
    reply, msg_id = chat_turn(page, "And mine?")
    assert Message.objects.get(pk=msg_id).routing  # recorded for everyone; linked for staff only
    assert "expert hits" in reply.locator(".msg-meta").inner_text()
    assert reply.locator("a.stat-link").count() == 0 and reply.locator("a[href^='/atlas']").count() == 0
    member.close()
