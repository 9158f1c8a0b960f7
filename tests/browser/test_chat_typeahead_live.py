"""Typing ahead while a reply streams, on the real stack (Daphne + bridge worker + native engine on
the fixture model): Enter mid-stream must not cut the reply, and the message typed ahead stays in
the box until the reply ends, when Enter sends it.

The fixture model decodes thousands of tokens a second, so a long max_tokens keeps a reply
streaming for a few seconds; the page records whether the reply was still streaming at the moment
Enter went down (a capture-phase listener). In an attempt where the reply ended first, Enter sent
the typed message, whose reply is the next attempt: one that shows the behaviour is the evidence
we want.
"""
import pytest

from tests.browser.conftest import PASSWORD, log_in
from tests.browser.test_chat_live import REPLY, finished, send

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RECORD_ENTER = """() => {
  // At each Enter in the composer: whether a reply was streaming (its status, and the composer
  // showing Stop, i.e. busy) at that moment.
  window.__enterWhile = [];
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Enter' || !e.target.classList.contains('composer-input')) return;
    const r = [...document.querySelectorAll('.msg-assistant')].pop();
    window.__enterWhile.push(!!r && r.dataset.status === 'streaming' && !document.querySelector('.stop').hidden);
  }, true);
}"""
STREAMING_TEXT = """sel => { const r = [...document.querySelectorAll(sel)].pop();
  return r && (r.dataset.status !== 'streaming' || r.querySelector('.msg-body').textContent.length > 0); }"""
ATTEMPTS = 4


def test_enter_mid_stream_keeps_the_reply_and_the_typed_message(live_stack, page_and_watch, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("alice", password=PASSWORD)
    log_in(page, live_stack.url, "alice")
    page.evaluate("localStorage.setItem('colibri.params', JSON.stringify({temperature: 0, top_p: 1, max_tokens: 6000}))")
    page.reload()
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    page.evaluate(RECORD_ENTER)

    send(page, "Tell me a long story about a hummingbird.")
    box = page.locator(".composer-input")
    for attempt in range(ATTEMPTS):
        page.wait_for_function(STREAMING_TEXT, arg=REPLY, timeout=60000)
        typed = f"and a question typed ahead ({attempt})"
        box.type(typed)  # key by key, as a person types ahead
        box.press("Enter")
        if page.evaluate("window.__enterWhile.pop()"):
            break
        # The reply had ended first, so Enter sent the message: its reply is the next attempt.
        page.locator(".msg-user", has_text=typed).wait_for()
    else:
        raise AssertionError("every reply ended before Enter reached the page")
    # Enter went down while the reply streamed: the reply goes on to its own end.
    reply = finished(page)
    assert reply.get_attribute("data-status") == "complete", reply.locator(".msg-meta").inner_text()
    meta = reply.locator(".msg-meta").inner_text()
    assert "Interrupted" not in meta and "length" in meta, meta  # it ran to max_tokens
    assert box.input_value() == typed  # kept, neither sent nor lost
    assert page.locator(".msg-user", has_text=typed).count() == 0

    # The reply has ended: Enter sends the message typed ahead, and its reply comes.
    first_id = reply.get_attribute("data-id")  # `reply` is a locator of the last reply: read it now
    box.press("Enter")
    page.locator(".msg-user", has_text=typed).wait_for()
    assert box.input_value() == ""
    page.wait_for_function(
        "old => { const r = [...document.querySelectorAll('.msg-assistant[data-id]')].pop(); return r && r.dataset.id !== old; }",
        arg=first_id)
    assert finished(page).get_attribute("data-status") == "complete"
    assert watch.dialogs == [] and watch.errors == []
