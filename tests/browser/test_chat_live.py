"""The chat page against the real stack: Daphne + bridge worker + native engine (fixture model).

One browser session: log in, send, stop the reply, reload and find the history (with the
interrupted reply's partial text), watch a reply grow as tokens stream, check that markup is
inert, and see no console error. The fixture model is tiny and fast (thousands of tokens/s):
greedy decoding with a large max_tokens keeps a reply streaming for a few hundred ms, and Stop
is clicked from inside the page on the first render that shows text. Even so the engine can
finish a whole reply before Stop (or even the first delta) reaches it, so those two checks retry
with Regenerate a few times: one attempt that shows the behaviour is the evidence we want.
"""
import pytest

from tests.browser.conftest import PASSWORD, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REPLY = ".msg-assistant[data-id]"
WATCH_REPLIES = """() => {
  window.__lengths = [];  // text lengths of the streaming reply, one entry per change
  window.__stopAtFirstText = false;
  window.__watched = null;
  new MutationObserver(() => {
    const r = [...document.querySelectorAll('.msg-assistant')].pop();
    if (!r || r.dataset.status !== 'streaming') return;
    if (window.__watched !== r.dataset.id) { window.__watched = r.dataset.id; window.__lengths = []; }
    const n = r.querySelector('.msg-body').textContent.length;
    if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
    if (window.__stopAtFirstText && r.querySelector('.msg-body .typing') === null && n > 0) {
      window.__stopAtFirstText = false;
      document.querySelector('.stop').click();  // shown while the reply streams
    }
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def last_reply(page):
    return page.locator(REPLY).last


def send(page, text):
    page.fill(".composer-input", text)
    page.keyboard.press("Enter")


def finished(page):
    """Waits until the LAST reply has ended (a replaced reply may still be on screen for a moment)."""
    page.wait_for_function(
        "sel => { const r = [...document.querySelectorAll(sel)].pop(); return r && r.dataset.status && r.dataset.status !== 'streaming'; }",
        arg=REPLY, timeout=60000)
    return last_reply(page)


ATTEMPTS = 6


def regenerate(page):
    """Regenerates the last reply and waits until its replacement (a new message id) is on screen."""
    old = last_reply(page).get_attribute("data-id")
    page.hover(REPLY + " >> nth=-1")
    page.click(f"{REPLY} >> nth=-1 >> text=Regenerate")
    page.wait_for_function(
        "old => { const r = [...document.querySelectorAll('.msg-assistant[data-id]')].pop(); return r && r.dataset.id !== old; }",
        arg=old)


def test_chat_session_on_the_real_stack(live_stack, page_and_watch, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("alice", password=PASSWORD)
    log_in(page, live_stack.url, "alice")
    page.evaluate("localStorage.setItem('colibri.params', JSON.stringify({temperature: 0, top_p: 1, max_tokens: 950}))")
    page.reload()
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    page.evaluate(WATCH_REPLIES)

    # Stop: the reply ends "interrupted" and keeps the text that had streamed.
    prompt = "Tell me a long story about a hummingbird."
    page.evaluate("window.__stopAtFirstText = true")
    send(page, prompt)
    page.wait_for_function("location.hash.startsWith('#c/')")
    conversation = page.evaluate("location.hash")
    reply = finished(page)
    for _ in range(ATTEMPTS - 1):
        if reply.get_attribute("data-status") == "interrupted":
            break
        page.evaluate("window.__stopAtFirstText = true")
        regenerate(page)
        reply = finished(page)
    assert reply.get_attribute("data-status") == "interrupted", reply.locator(".msg-meta").inner_text()
    reply.locator(".badge", has_text="Interrupted").wait_for()
    partial = reply.locator(".msg-body").inner_text().strip()
    assert partial
    assert page.locator(".stop").is_hidden() and page.locator(".send").is_enabled()

    # The history survives a reload, including the interrupted reply's partial text.
    page.reload()
    page.wait_for_selector(f'{REPLY}[data-status="interrupted"]')
    assert page.evaluate("location.hash") == conversation
    assert page.locator(".msg-user .msg-body").first.inner_text() == prompt
    assert last_reply(page).locator(".msg-body").inner_text().strip() == partial
    page.wait_for_selector(f'.conv-active[data-id="{conversation[3:]}"]')
    screenshot(page, "chat-live")

    # Streaming, in a new chat: the reply's text grows over several renders, never shrinks.
    # The prompt carries markup: it round-trips through the server as text and nothing runs.
    page.evaluate(WATCH_REPLIES)
    page.click(".new-chat")
    hostile = '<img src=x onerror="window.__pwned=1;alert(1)"><script>window.__pwned=2;alert(2)</script>'
    send(page, hostile)
    for _ in range(ATTEMPTS):
        reply = finished(page)
        lengths = page.evaluate("window.__lengths")
        grown = [n for n in lengths if n > 0]
        if len(grown) >= 3:
            break
        page.evaluate("window.__lengths = []")
        regenerate(page)
    replies = page.evaluate("[...document.querySelectorAll('.msg-assistant')].map(r => r.dataset.id + ':' + r.dataset.status)")
    assert len(grown) >= 3 and grown == sorted(grown), f"reply did not stream: {lengths} (replies {replies})"
    assert reply.get_attribute("data-status") == "complete"
    meta = reply.locator(".msg-meta").inner_text()
    assert "tok/s" in meta and "prompt" in meta, meta
    assert page.locator(".msg-user .msg-body").last.inner_text() == hostile
    assert page.locator(".msg-body img, .msg-body script, [onerror]").count() == 0
    assert page.evaluate("window.__pwned") is None

    assert watch.dialogs == []
    assert watch.errors == []
