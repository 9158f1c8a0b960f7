"""The chat page against a scripted websocket and mocked JSON endpoints (no engine needed).

The server side of docs/contracts.md is played by FakeChat; each test checks one behaviour of
the front end: inert model markup, delta offsets, stop/stats, errors, edit, conversations, keys.
"""
import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import PASSWORD, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONV = {"id": 7, "title": "Greetings", "created": "2026-11-30T10:00:00+00:00", "updated": "2026-11-30T10:00:00+00:00"}
OLDER = {"id": 3, "title": "SQL window functions", "created": "2026-11-28T10:00:00+00:00", "updated": "2026-11-28T10:05:00+00:00"}


def msg(mid, role, text, status="complete", stats=None, conv=7):
    return {"id": mid, "conversation": conv, "role": role, "text": text, "status": status, "stats": stats, "created": "2026-11-30T10:00:00+00:00"}


STATS = {"prompt_tokens": 31, "completion_tokens": 42, "ttft_s": 0.18, "tok_s": 23.4, "hit_pct": 91.5, "finish_reason": "stop"}


class FakeChat:
    """Plays the server: records client frames, pushes server frames, answers the JSON endpoints."""

    def __init__(self, page, conversations=(OLDER,), health=(200, {"engine": "up", "restarts": 0})):
        self.page = page
        self.ws = None
        self.frames = []
        self.requests = []
        self.conversations = [dict(c) for c in conversations]
        self.health = health
        self.keys = []
        self.hold_settings, self.held = False, []
        self.models = {"default": "tiny", "models": [
            {"id": "tiny", "display_name": "tiny", "context_length": 4096, "status": "up", "bridges": ["main"]}]}
        page.route_web_socket(re.compile(r".*/ws/chat/$"), self._connect)
        page.route(re.compile(r".*/(api/.*|health)(\?.*)?$"), self._http)

    def _connect(self, ws):
        self.ws = ws
        ws.on_message(lambda m: self.frames.append(json.loads(m)))

    def _http(self, route):
        req = route.request
        path = req.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        self.requests.append((req.method, "/" + path, req.headers, req.post_data))
        if path == "health":
            status, body = self.health
            return route.fulfill(status=status, json=body)
        if path == "api/conversations":
            return route.fulfill(json={"conversations": self.conversations})
        if path == "api/models":
            return route.fulfill(json=self.models)
        m = re.fullmatch(r"api/conversations/(\d+)", path)
        conv = next((c for c in self.conversations if m and c["id"] == int(m[1])), None)
        if conv is not None and req.method == "GET":
            if self.hold_settings:  # the test answers it later (release_settings)
                return self.held.append((route, conv))
            return route.fulfill(json={"model": "", "system_prompt": "", **conv})
        if conv is not None and req.method == "PATCH":
            conv.update(json.loads(req.post_data))
            return route.fulfill(json=conv)
        if m and req.method == "DELETE":
            self.conversations = [c for c in self.conversations if c["id"] != int(m[1])]
            return route.fulfill(status=204, body="")
        if path == "api/keys" and req.method == "GET":
            return route.fulfill(json={"keys": self.keys})
        if path == "api/keys" and req.method == "POST":
            key = {"id": 1, "name": json.loads(req.post_data)["name"], "prefix": "ab12cd34", "created": "2026-11-30T10:00:00+00:00", "last_used": None}
            self.keys.append(key)
            return route.fulfill(status=201, json={**key, "key": "col-ab12cd34-s3cr3t"})
        if re.fullmatch(r"api/keys/\d+", path) and req.method == "DELETE":
            self.keys = []
            return route.fulfill(status=204, body="")
        return route.fulfill(status=404, json={"error": "not found"})

    def release_settings(self):
        """Answers the held GETs of a conversation's settings."""
        self.hold_settings = False
        for route, conv in self.held:
            route.fulfill(json={"model": "", "system_prompt": "", **conv})
        self.held = []

    def push(self, **frame):
        self.ws.send(json.dumps(frame))

    def wait_frame(self, kind, timeout=10.0, **match):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for f in self.frames:
                if f.get("type") == kind and all(f.get(k) == v for k, v in match.items()):
                    return f
            self.page.wait_for_timeout(50)
        raise AssertionError(f"no {kind} frame {match}; got {self.frames}")

    def start_reply(self, text="hello"):
        """User sends `text` into a new chat; the server creates conversation 7 and starts reply 2."""
        self.page.fill(".composer-input", text)
        self.page.keyboard.press("Enter")
        frame = self.wait_frame("send")
        assert frame["conversation"] is None and frame["text"] == text
        assert set(frame["params"]) == {"max_tokens"}  # sampling left to the served model's defaults
        self.conversations.insert(0, CONV)
        self.push(type="conversation", conversation=CONV)
        self.push(type="message", message=msg(1, "user", text))
        self.push(type="message", message=msg(2, "assistant", "", "streaming"))
        self.push(type="started", message=2, prompt_tokens=31)


@pytest.fixture
def chat(page_and_watch, live_server, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("alice", password=PASSWORD)
    fake = FakeChat(page)
    log_in(page, live_server.url, "alice")
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'")
    return page, watch, fake


def reply_text(page, mid=2):
    return page.inner_text(f'.msg[data-id="{mid}"] .msg-body')


def test_model_markup_is_rendered_inert(chat):
    page, watch, fake = chat
    fake.start_reply("<b>not bold</b> <img src=x onerror=alert(9)>")
    payload = (
        'Sure. <img src=x onerror="window.__pwned=1;alert(1)"> and '
        "<script>window.__pwned=2;alert(2)</script> "
        '<a href="javascript:alert(3)">click</a> <iframe src="javascript:alert(4)"></iframe>\n\n'
        '```python\nprint("hi")\n```\n'
    )
    # Cut mid-tag on purpose: half-received markup must be just as inert.
    offset = 0
    for chunk in (payload[:20], payload[20:61], payload[61:]):
        fake.push(type="delta", message=2, offset=offset, text=chunk)
        offset += len(chunk)
        page.wait_for_timeout(60)
    fake.push(type="done", message=msg(2, "assistant", payload, "complete", STATS))
    page.wait_for_selector('.msg[data-id="2"][data-status="complete"] pre code.hljs')
    page.wait_for_timeout(300)  # give any injected handler a chance to fire

    assert page.evaluate("window.__pwned") is None
    assert watch.dialogs == []
    body = '.msg[data-id="2"] .msg-body'
    for selector in ("img", "script", "iframe", "[onerror]", 'a[href^="javascript"]'):
        assert page.locator(f"{body} {selector}").count() == 0, selector
    assert page.locator(f'{body} a[rel~="noopener"]').count() == page.locator(f"{body} a").count()
    # The user's own text is shown verbatim, never parsed.
    user = page.locator('.msg[data-id="1"] .msg-body')
    assert user.locator("b, img").count() == 0
    assert "<b>not bold</b>" in user.inner_text()
    assert watch.errors == []


def test_deltas_stream_without_duplicates_and_a_gap_resyncs(chat):
    page, watch, fake = chat
    fake.start_reply()
    expect(page.locator(".stop")).to_be_visible()
    expect(page.locator(".send")).to_be_disabled()
    fake.push(type="delta", message=2, offset=0, text="Hel")
    page.wait_for_function("document.querySelector('.msg[data-id=\"2\"] .msg-body').innerText.includes('Hel')")
    assert "Generating" in page.inner_text('.msg[data-id="2"] .msg-meta') or "Reading" in page.inner_text('.msg[data-id="2"] .msg-meta')
    fake.push(type="delta", message=2, offset=3, text="lo")
    fake.push(type="delta", message=2, offset=0, text="Hello")  # replayed after a reconnect
    fake.push(type="delta", message=2, offset=3, text="lo wor")  # overlaps what we have
    fake.push(type="delta", message=2, offset=9, text="ld")
    page.wait_for_function("document.querySelector('.msg[data-id=\"2\"] .msg-body').innerText.trim() === 'Hello world'")
    fake.frames.clear()
    fake.push(type="delta", message=99, offset=0, text="other chat")  # not on screen: ignored
    page.wait_for_timeout(200)
    assert [f for f in fake.frames if f["type"] == "open"] == []
    fake.push(type="delta", message=2, offset=50, text="?")  # a gap: deltas were lost
    fake.wait_frame("open", conversation=7)
    fake.push(type="snapshot", conversation=7, messages=[msg(1, "user", "hello"), msg(2, "assistant", "Hello world, again", "streaming")])
    page.wait_for_function("document.querySelector('.msg[data-id=\"2\"] .msg-body').innerText.trim() === 'Hello world, again'")
    assert page.evaluate("location.hash") == "#c/7"
    assert watch.errors == []


def test_stop_marks_the_reply_interrupted_and_shows_stats(chat):
    page, watch, fake = chat
    fake.start_reply()
    fake.push(type="delta", message=2, offset=0, text="Partial answer")
    page.click(".stop")
    fake.wait_frame("stop", conversation=7)
    fake.push(type="done", message=msg(2, "assistant", "Partial answer", "interrupted", {**STATS, "finish_reason": "stop"}))
    meta = page.locator('.msg[data-id="2"] .msg-meta')
    meta.get_by_text("Interrupted").wait_for()
    text = meta.inner_text()
    for part in ("31 tok", "42 tok", "0.18 s", "23.4 tok/s", "92%", "stop"):
        assert part in text, (part, text)
    expect(page.locator(".stop")).to_be_hidden()
    expect(page.locator(".send")).to_be_enabled()
    # Regenerate replaces the last reply.
    page.hover('.msg[data-id="2"]')
    page.click('.msg[data-id="2"] >> text=Regenerate')
    frame = fake.wait_frame("regenerate", conversation=7)
    assert frame["params"]["max_tokens"] > 0
    expect(page.locator('.msg[data-id="2"]')).to_have_count(0)
    assert watch.errors == []


def test_errors_are_explained(chat):
    page, watch, fake = chat
    fake.start_reply()
    fake.push(type="error", message=2, code="CONTEXT_EXCEEDED", detail="prompt is 5000 tokens, context is 4096")
    fake.push(type="done", message=msg(2, "assistant", "", "error"))
    page.locator('.msg[data-id="2"] .msg-error').get_by_text("context window").wait_for()
    assert "Failed" in page.inner_text('.msg[data-id="2"] .msg-meta')
    fake.push(type="error", message=None, code="QUEUE_FULL", detail="")
    page.locator("#notices").get_by_text("queue is full").wait_for()
    # /health says the engine is restarting: a banner says so, and the badge too.
    fake.health = (503, {"engine": "starting", "restarts": 1})
    fake.push(type="error", message=None, code="ENGINE_DIED", detail="engine exited")
    page.locator("#notices").get_by_text("replies will resume").wait_for()
    page.wait_for_function("document.querySelector('.engine-badge').textContent.includes('restarting')")
    # Chromium logs every non-2xx response; the 503s of /health are expected here.
    assert [e for e in watch.errors if "503" not in e] == []


def test_edit_and_resend(chat):
    page, watch, fake = chat
    fake.start_reply("first try")
    fake.push(type="done", message=msg(2, "assistant", "An answer", "complete", STATS))
    page.hover('.msg[data-id="1"]')
    page.click('.msg[data-id="1"] >> text=Edit')
    page.fill(".edit-area", "second try")
    page.click("text=Save & resend")
    frame = fake.wait_frame("edit", conversation=7, message=1)
    assert frame["text"] == "second try"
    # The page re-renders after the frame went out: wait for it rather than read at once.
    expect(page.locator('.msg[data-id="2"]')).to_have_count(0)
    expect(page.locator('.msg[data-id="1"] .msg-body')).to_have_text("second try")
    assert watch.errors == []


def test_conversations_rename_delete_and_search(chat):
    page, watch, fake = chat
    page.locator(".conv-title", has_text="SQL window functions").wait_for()
    page.hover('.conv[data-id="3"]')
    page.click('.conv[data-id="3"] [aria-label^="Rename"]')
    page.fill(".rename", "Window functions")
    page.keyboard.press("Enter")
    page.locator(".conv-title", has_text="Window functions").wait_for()
    method, path, headers, body = next(r for r in fake.requests if r[0] == "PATCH")
    assert path == "/api/conversations/3" and json.loads(body) == {"title": "Window functions"}
    assert headers.get("x-csrftoken")
    page.fill(".search", "window")
    page.wait_for_timeout(400)
    assert any(r[1] == "/api/conversations" for r in fake.requests)
    watch.accept_confirms = True
    page.hover('.conv[data-id="3"]')
    page.click('.conv[data-id="3"] [aria-label^="Delete"]')
    page.wait_for_selector('.conv[data-id="3"]', state="detached")
    assert any(r[0] == "DELETE" and r[1] == "/api/conversations/3" for r in fake.requests)
    assert watch.errors == []


def test_api_keys_are_shown_once_and_revocable(chat):
    page, watch, fake = chat
    page.click("#keys-open")
    page.fill(".key-create input", "laptop")
    page.click("text=Create key")
    page.locator(".key-secret code").get_by_text("col-ab12cd34-s3cr3t").wait_for()
    post = next(r for r in fake.requests if r[0] == "POST")
    assert post[2].get("x-csrftoken")
    assert "laptop" in page.inner_text(".keys-table")
    watch.accept_confirms = True
    page.click(".keys-table >> text=Revoke")
    page.locator(".keys-dialog").get_by_text("No keys yet.").wait_for()
    assert watch.errors == []


def test_screenshot_of_a_conversation(chat):
    page, watch, fake = chat
    fake.start_reply("How do I list the ten largest files in a directory tree?")
    answer = (
        "Use `find` with `du`, then sort by size:\n\n"
        "```bash\nfind . -type f -exec du -h {} + | sort -rh | head -n 10\n```\n\n"
        "* `-exec du -h {} +` measures many files per call\n"
        "* `sort -rh` sorts human-readable sizes, largest first\n\n"
        "In Python:\n\n```python\nfrom pathlib import Path\n\nfiles = sorted(Path('.').rglob('*'), key=lambda p: p.stat().st_size if p.is_file() else 0)\nprint(files[-10:])\n```\n"
    )
    fake.push(type="delta", message=2, offset=0, text=answer)
    fake.push(type="done", message=msg(2, "assistant", answer, "complete", STATS))
    fake.push(type="message", message=msg(3, "user", "And only files over 100 MB?"))
    fake.push(type="message", message=msg(4, "assistant", "", "streaming"))
    fake.push(type="started", message=4, prompt_tokens=180)
    fake.push(type="delta", message=4, offset=0, text="Add `-size +100M` to the `find` call:")
    page.wait_for_selector('.msg[data-id="4"] .msg-body code')
    page.click("#settings-toggle")
    page.wait_for_timeout(300)
    screenshot(page, "chat")
    assert watch.errors == []


def test_sampling_sliders_start_at_the_models_recommendation_and_send_only_a_choice(chat):
    page, watch, fake = chat
    fake.health = (200, {"engine": "up", "restarts": 0, "sampling": {"temperature": 0.2, "top_p": 0.9}})
    page.reload()
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'")
    page.click("#settings-toggle")
    temperature = page.locator('input[name="temperature"]')
    expect(temperature).to_have_value("0.2")
    expect(page.locator(".param", has=temperature).locator("output")).to_have_text("0.2 (model default)")
    temperature.fill("1.3")  # a range input takes fill() as a value change (input event)
    expect(page.locator(".param", has=temperature).locator("output")).to_have_text("1.3")
    page.fill(".composer-input", "hi")
    page.keyboard.press("Enter")
    frame = fake.wait_frame("send")
    assert frame["params"]["temperature"] == 1.3 and "top_p" not in frame["params"]
    assert watch.errors == []


def test_a_send_before_the_conversations_settings_arrive_leaves_them_alone(chat):
    """The picker shows a conversation's model once its GET answered; a message sent before that
    carries no model or system prompt (blanks would overwrite the stored ones), one sent after
    carries the conversation's own, and a New chat's first message carries the picker's choice."""
    page, watch, fake = chat
    fake.models = {"default": "tiny", "models": [
        {"id": m, "display_name": m, "context_length": 4096, "status": "up", "bridges": [b]}
        for m, b in (("tiny", "main"), ("tiny-b", "second"))]}
    fake.conversations[0].update(model="tiny-b", system_prompt="Be brief.")
    page.reload()
    page.wait_for_function("document.querySelectorAll('#model-slot select option').length === 3")
    fake.hold_settings = True
    page.goto(page.url.split("#")[0] + "#c/3")
    fake.wait_frame("open", conversation=3)
    page.fill(".composer-input", "first")
    page.keyboard.press("Enter")
    early = fake.wait_frame("send", text="first")
    assert early["conversation"] == 3 and "model" not in early and "system_prompt" not in early
    fake.push(type="error", message=None, code="busy", detail="scripted: no turn")  # the composer is free again
    fake.release_settings()
    page.wait_for_function("document.querySelector('#model-slot select').value === 'tiny-b'")
    page.fill(".composer-input", "second")
    page.keyboard.press("Enter")
    later = fake.wait_frame("send", text="second")
    assert later["model"] == "tiny-b" and later["system_prompt"] == "Be brief."
    fake.push(type="error", message=None, code="busy", detail="scripted: no turn")
    page.locator("#conv-nav .new-chat").click()
    page.locator("#model-slot select").select_option("tiny-b")
    page.fill(".composer-input", "third")
    page.keyboard.press("Enter")
    fresh = fake.wait_frame("send", text="third")
    assert fresh["conversation"] is None and fresh["model"] == "tiny-b" and fresh["system_prompt"] == ""
    assert watch.errors == [], watch.errors


def test_thinking_streams_in_its_own_section_and_folds_when_the_answer_starts(chat):
    page, watch, fake = chat
    fake.start_reply("2+2?")
    section, label = page.locator('.msg[data-id="2"] .thinking'), page.locator('.msg[data-id="2"] .thinking-label')
    expect(section).to_be_hidden()  # nothing thought yet
    hostile = 'Two and two. <img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> **four**'
    fake.push(type="thinking", message=2, offset=0, text=hostile[:20])
    expect(section).to_be_visible()
    expect(section).to_have_attribute("open", "")
    expect(label).to_contain_text("Thinking…")
    assert "Thinking" in page.inner_text('.msg[data-id="2"] .msg-meta')
    fake.push(type="thinking", message=2, offset=20, text=hostile[20:])
    expect(section.locator(".thinking-body strong")).to_have_text("four")  # sanitised markdown
    assert section.locator("img, script, [onerror]").count() == 0
    assert reply_text(page).strip() == ""  # the thinking is not the reply
    # The answer starts: the section folds, its label says how long it took, the reply streams.
    fake.push(type="delta", message=2, offset=0, text="Four.")
    expect(section).not_to_have_attribute("open", "")
    expect(label).to_have_text(re.compile(r"^Thought for \d+(\.\d)? s$"))
    assert reply_text(page).strip() == "Four."
    # The reader opens it: more answer does not fold it again.
    page.click('.msg[data-id="2"] .thinking > summary')
    fake.push(type="delta", message=2, offset=5, text=" Sure.")
    page.wait_for_function("document.querySelector('.msg[data-id=\"2\"] .msg-body').innerText.includes('Sure.')")
    expect(section).to_have_attribute("open", "")
    final = {**msg(2, "assistant", "Four. Sure.", "complete", {**STATS, "thinking_s": 2.5, "reasoning_tokens": 9}),
             "thinking": hostile}
    fake.push(type="done", message=final)
    expect(label).to_have_text("Thought for 2.5 s")
    assert "thinking 9 tok" in page.inner_text('.msg[data-id="2"] .msg-meta')
    # A reload's snapshot shows it folded, with the reply.
    fake.push(type="snapshot", conversation=7, messages=[msg(1, "user", "2+2?"), final])
    expect(section).to_be_visible()
    assert page.evaluate("window.__pwned") is None
    screenshot(page, "chat-thinking")
    assert watch.errors == []


def test_enter_while_a_reply_streams_keeps_the_reply_and_the_typed_message(chat):
    """Enter never stops a reply: Stop is its own button. The message typed ahead stays in the box
    (as ChatGPT's composer keeps it) and Enter sends it once the reply has ended."""
    page, watch, fake = chat
    fake.start_reply()
    fake.push(type="delta", message=2, offset=0, text="A long answer")
    page.fill(".composer-input", "and the next question")
    page.keyboard.press("Enter")
    page.click(".send", force=True)  # the (disabled) Send button does nothing either
    expect(page.locator(".composer-hint")).to_contain_text("stays here")
    page.wait_for_timeout(300)
    assert [f["type"] for f in fake.frames if f["type"] in ("stop", "send")] == ["send"]  # the first send only
    expect(page.locator(".composer-input")).to_have_value("and the next question")
    fake.push(type="delta", message=2, offset=13, text=" goes on.")
    fake.push(type="done", message=msg(2, "assistant", "A long answer goes on.", "complete", STATS))
    expect(page.locator('.msg[data-id="2"]')).to_have_attribute("data-status", "complete")
    assert page.locator('.msg[data-id="2"] .badge', has_text="Interrupted").count() == 0
    expect(page.locator(".composer-hint")).to_be_hidden()
    page.locator(".composer-input").press("Enter")
    frame = fake.wait_frame("send", text="and the next question")
    assert frame["conversation"] == 7
    expect(page.locator(".composer-input")).to_have_value("")
    assert watch.errors == []
