"""The pages on a phone and on a desktop (issue 26 item 4), in headless Chromium at 390 x 844
(mobile, touch) and 1280 x 800: nothing scrolls sideways on the chat, atlas and ops pages (a long
conversation with unbroken words, a wide code block, a wide table and tool calls; a 48 x 128 expert
grid; the ops charts and tables), every chat control is reachable on the phone through the menu
(drawer: focus, inert chat, Escape), the composer stays inside the viewport when the on-screen
keyboard takes half the screen, and each page's screenshot at each size is checked structurally:
where the layout says the menu button, sidebar and composer are, the screenshot's pixels agree.

The server side is scripted as in test_chat_ui / test_atlas_ui (the real pages from Django's live
server, websockets and JSON endpoints played by the test): layout needs no engine.
"""
import base64
import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.browser.conftest import PASSWORD, PageWatch
from tests.browser.test_atlas_ui import BIG_BYTES, BIG_COLS, BIG_ROWS, DOC, INFO, MAP, SNAPSHOT
from tests.browser.test_chat_ui import OLDER, FakeChat

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SIZES = {
    "phone": {"viewport": {"width": 390, "height": 844}, "device_scale_factor": 2, "is_mobile": True, "has_touch": True},
    "desktop": {"viewport": {"width": 1280, "height": 800}},
}
BG, PANEL, ACCENT = (0xFB, 0xFB, 0xFA), (0xF3, 0xF3, 0xF0), (0x0F, 0x76, 0x6E)  # styles/app.css

LONG = {"id": 7, "title": "A long conversation with unbroken words and a wide code block",
        "created": "2026-12-01T10:00:00+00:00", "updated": "2026-12-02T10:00:00+00:00"}
WORD = "Supercalifragilisticexpialidocious" * 9  # 306 characters, no break opportunity
URL = "https://example.org/" + "segment/" * 30
CODE = "```python\nresult = compute(" + ", ".join(f"argument_number_{i}" for i in range(24)) + ")\n```"
TABLE = ("| " + " | ".join(f"column {i}" for i in range(14)) + " |\n|" + "---|" * 14 + "\n| "
         + " | ".join(f"value{i}" for i in range(14)) + " |")
ARGS = json.dumps({"path": "/srv/" + "deeply_nested_directory_name/" * 12, "pattern": WORD})


def _msg(mid, role, text, **extra):
    return {"id": mid, "conversation": 7, "role": role, "text": text, "status": "complete", "stats": None,
            "created": "2026-12-01T10:00:00+00:00", **extra}


def long_conversation():
    """Every kind of turn that could push the page sideways, and enough of them to scroll."""
    out = [_msg(1, "system", f"You are terse. {WORD}")]
    mid = 2
    for _ in range(3):
        out += [
            _msg(mid, "user", f"What does {WORD} mean? See {URL}"),
            _msg(mid + 1, "assistant", f"It is {WORD}, see <{URL}>.\n\n{CODE}\n\n{TABLE}\n\nInline `{WORD}` too."),
            _msg(mid + 2, "assistant", "", tool_calls=[{"id": f"call_{mid}_" + "x" * 60, "name": "search_files", "arguments": ARGS}]),
            _msg(mid + 3, "tool", json.dumps({"matches": [WORD, URL]}), tool_call_id=f"call_{mid}_" + "x" * 60),
        ]
        mid += 4
    return out


# Elements whose whole point is to scroll inside their own block when their content is wider.
SCROLL_INSIDE = "pre, pre > code, table, .grid-wrap, .ops-table-panel, .keys-list, .key-secret code, textarea"
OVERFLOW = """(allowed) => {
  const doc = document.documentElement;
  const out = {doc: [doc.scrollWidth, doc.clientWidth], body: [document.body.scrollWidth, document.body.clientWidth],
               inner: window.innerWidth, scale: visualViewport.scale, boxes: []};
  for (const el of document.querySelectorAll('body *')) {
    const s = getComputedStyle(el);
    if (!/(auto|scroll)/.test(s.overflowX) || el.matches(allowed) || el.closest('[hidden], dialog:not([open])')) continue;
    if (el.scrollWidth > el.clientWidth + 1) out.boxes.push(`${el.tagName.toLowerCase()}#${el.id}.${el.className}: ${el.scrollWidth} > ${el.clientWidth}`);
  }
  return out;
}"""
# Reads pixels of a PNG (a screenshot) back through a canvas: [x, y] in CSS pixels, scaled by dpr.
PIXELS = """async ([png, points, dpr]) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  return {size: [img.naturalWidth, img.naturalHeight],
          px: points.map(([x, y]) => Array.from(g.getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data).slice(0, 3))};
}"""


@pytest.fixture
def site(live_server, django_user_model):
    django_user_model.objects.create_user("pia", password=PASSWORD, is_staff=True)
    return live_server.url


@pytest.fixture
def open_page(browser):
    contexts = []

    def make(size):
        context = browser.new_context(bypass_csp=True, **SIZES[size])
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15000)
        return page, PageWatch(page)

    yield make
    for c in contexts:
        c.close()


def log_in(page, base_url, path="/"):
    """Signs in on the way to `path` (conftest.log_in waits for the new-chat button to be visible:
    on a phone it is in the closed drawer; and the atlas and ops pages need no chat page first)."""
    page.goto(f"{base_url}{path}")
    page.fill("#id_username", "pia")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}{path}")


def box(page, selector):
    return page.locator(selector).first.bounding_box()


def assert_no_sideways_scroll(page, where):
    got = page.evaluate(OVERFLOW, SCROLL_INSIDE)
    # A mobile browser widens the layout viewport to fit wide content (and zooms out), so
    # clientWidth alone could grow with the overflow: the page must also fit the device width.
    width = page.viewport_size["width"]
    assert got["doc"][1] == width and got["inner"] == width and got["scale"] == 1, f"{where}: zoomed out to fit {got}"
    assert got["doc"][0] <= got["doc"][1], f"{where}: the page scrolls sideways {got}"
    assert got["body"][0] <= got["body"][1], f"{where}: the body scrolls sideways {got}"
    assert got["boxes"] == [], f"{where}: these scroll sideways: {got['boxes']}"


def shoot(page, tmp_path, name, full_page=False):
    """A screenshot under the test's tmp dir (and $BROWSER_SCREENSHOTS when set)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    folder = os.environ.get("BROWSER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / path.name).write_bytes(path.read_bytes())
    return path


def pixels(page, path, points):
    """The colours of a screenshot at CSS-pixel points, decoded in a blank page of the same context."""
    reader = page.context.new_page()
    try:
        dpr = page.evaluate("devicePixelRatio")
        got = reader.evaluate(PIXELS, [base64.b64encode(path.read_bytes()).decode(), points, dpr])
    finally:
        reader.close()
    vp = page.viewport_size
    assert got["size"] == [round(vp["width"] * dpr), round(vp["height"] * dpr)], got["size"]
    return got["px"]


def near(rgb, want, tol=6):
    return all(abs(a - b) <= tol for a, b in zip(rgb, want))


def centre(b):
    return [b["x"] + b["width"] / 2, b["y"] + b["height"] / 2]


def open_long_chat(page, base_url):
    fake = FakeChat(page, conversations=(LONG, OLDER))
    log_in(page, base_url)
    page.wait_for_selector("#conv-nav .new-chat", state="attached")
    page.goto(f"{base_url}/#c/7")
    fake.wait_frame("open", conversation=7)
    fake.push(type="snapshot", conversation=7, messages=long_conversation())
    page.locator(".msg-tool").nth(2).wait_for(state="attached")
    page.locator(".engine-badge", has_text="engine ready").wait_for()
    page.wait_for_timeout(300)  # one more frame: the pane scrolls to the bottom
    return fake


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_the_chat_page_fits_and_its_screenshot_shows_the_layout(site, open_page, tmp_path, size):
    page, watch = open_page(size)
    open_long_chat(page, site)
    vw, vh = page.viewport_size["width"], page.viewport_size["height"]
    assert_no_sideways_scroll(page, f"chat at {size}")
    # The content is wide for real: the code block scrolls inside itself, within the column.
    code = page.locator(".msg-assistant pre code.language-python").first
    assert code.evaluate("e => e.scrollWidth > e.clientWidth + 100 && getComputedStyle(e).overflowX === 'auto'")
    column = box(page, "#scroller")
    for sel in (".msg-user .msg-body", ".msg-assistant pre", ".tool-call", ".msg-tool .msg-body", ".msg-system .msg-body"):
        b = page.locator(sel).first.bounding_box()
        assert b["x"] >= column["x"] - 0.5 and b["x"] + b["width"] <= column["x"] + column["width"] + 0.5, (sel, b, column)

    shot = shoot(page, tmp_path, f"chat-{size}")
    head, composer, send, menu = box(page, ".chat-head"), box(page, ".composer-box"), box(page, ".send"), box(page, "#menu-toggle")
    # Both sizes: the composer sits at the foot of the viewport, under the messages.
    assert vh - 40 <= composer["y"] + composer["height"] <= vh, composer
    assert composer["y"] > column["y"] + column["height"] - 1
    if size == "phone":
        assert page.locator("#sidebar").is_hidden() and page.locator("#menu-toggle").is_visible()
        assert menu["x"] < 40 and head["y"] <= menu["y"] and menu["y"] + menu["height"] <= head["y"] + head["height"]
        assert composer["width"] >= vw - 32 and composer["x"] <= 16  # edge to edge, bar a small margin
        assert head["width"] == vw
    else:
        side = box(page, "#sidebar")
        assert page.locator("#menu-toggle").is_hidden() and menu is None
        assert side["x"] == 0 and side["width"] == 272 and side["height"] == vh
        assert composer["width"] <= 780 and composer["x"] > 272
        chat_mid = 272 + (vw - 272) / 2
        assert abs(composer["x"] + composer["width"] / 2 - chat_mid) < 2  # centred in the chat pane
    # The screenshot agrees: the Send button is painted where its box is (nothing covers it), and
    # the left edge shows the sidebar's panel colour on a desktop, the chat's background on a phone.
    send_px, edge_px = pixels(page, shot, [centre(send), [6, vh / 2]])
    assert near(send_px, ACCENT, 12), send_px
    assert near(edge_px, BG if size == "phone" else PANEL, 3), edge_px
    assert page.locator("#model-slot").count() == 1
    assert watch.errors == [], watch.errors


def test_on_a_phone_every_control_is_reachable_through_the_menu(site, open_page, tmp_path):
    page, watch = open_page("phone")
    fake = open_long_chat(page, site)
    menu, drawer = page.locator("#menu-toggle"), page.locator("#sidebar")
    assert menu.get_attribute("aria-controls") == "sidebar" and menu.get_attribute("aria-expanded") == "false"
    # The model picker (issue 26 item 3) is in the header, on a row of its own under the title,
    # within the width and usable without the drawer.
    picker = page.locator(".chat-head #model-slot[data-slot=model-picker] select[name=model]")
    picker.wait_for(state="visible")
    b, title = picker.bounding_box(), box(page, "#chat-title")
    assert b["x"] >= 0 and b["x"] + b["width"] <= 390 and b["y"] >= title["y"] + title["height"] - 1, (b, title)
    assert picker.locator("option").all_inner_texts() == ["Default (tiny)", "tiny"]

    # Open: the drawer slides in, focus moves into it, the chat behind is inert (Tab stays inside).
    menu.tap()
    drawer.locator(".new-chat").wait_for(state="visible")
    assert menu.get_attribute("aria-expanded") == "true"
    page.wait_for_function("document.activeElement && document.activeElement.classList.contains('new-chat')")
    assert page.evaluate("document.getElementById('chat-main').inert")
    for _ in range(12):
        page.keyboard.press("Tab")
        assert page.evaluate("!!document.activeElement.closest('#sidebar')"), page.evaluate("document.activeElement.outerHTML")
    page.wait_for_timeout(250)  # the slide-in transition
    d = drawer.bounding_box()
    assert d["x"] == 0 and d["width"] <= 390 * 0.86 + 1 and d["height"] == 844
    for sel in (".new-chat", ".search", '.conv[data-id="3"] .conv-open', '.conv[data-id="3"] [aria-label^="Rename"]', "#keys-open",
                "a[href='/atlas']", "a[href='/ops']", ".sidebar-foot button[type=submit]", "#menu-close"):
        b = box(page, sel)
        assert b and b["x"] >= 0 and b["x"] + b["width"] <= d["width"] and 0 <= b["y"] and b["y"] + b["height"] <= 844, (sel, b)
    shot = shoot(page, tmp_path, "chat-phone-menu")
    inside, scrim = pixels(page, shot, [[6, 420], [375, 420]])
    assert near(inside, PANEL, 3), inside  # the drawer's panel colour over the chat's left edge
    assert max(scrim) < 225, scrim  # the chat behind the scrim is dimmed

    # Escape closes it and gives focus back to the menu button.
    page.keyboard.press("Escape")
    drawer.locator(".new-chat").wait_for(state="hidden")
    assert menu.get_attribute("aria-expanded") == "false" and not page.evaluate("document.getElementById('chat-main').inert")
    assert page.evaluate("document.activeElement.id") == "menu-toggle"
    # The scrim and the close button close it too.
    menu.tap()
    page.locator("#drawer-scrim").tap(position={"x": 370, "y": 400})
    drawer.locator(".new-chat").wait_for(state="hidden")
    menu.tap()
    page.locator("#menu-close").tap()
    drawer.locator(".new-chat").wait_for(state="hidden")

    # A conversation chosen in the drawer opens and closes it.
    menu.tap()
    fake.frames.clear()
    page.locator('.conv[data-id="3"] .conv-open').tap()
    fake.wait_frame("open", conversation=3)
    drawer.locator(".new-chat").wait_for(state="hidden")
    page.wait_for_function("location.hash === '#c/3'")
    # New chat from the drawer.
    menu.tap()
    drawer.locator(".new-chat").tap()
    drawer.locator(".new-chat").wait_for(state="hidden")
    page.wait_for_function("location.hash === '' && document.getElementById('chat-title').textContent === 'New chat'")
    assert page.evaluate("document.activeElement.classList.contains('composer-input')")

    # Settings from the header: the panel fits the width; Escape folds it away.
    page.locator("#settings-toggle").tap()
    temperature = page.locator('input[name="temperature"]')
    temperature.wait_for(state="visible")
    assert page.locator("#settings-toggle").get_attribute("aria-expanded") == "true"
    for b in (temperature.bounding_box(), box(page, 'input[name="max_tokens"]'), box(page, 'textarea[name="system_prompt"]')):
        assert b["x"] >= 0 and b["x"] + b["width"] <= 390, b
    assert_no_sideways_scroll(page, "chat with the settings open")
    shoot(page, tmp_path, "chat-phone-settings")
    page.keyboard.press("Escape")
    temperature.wait_for(state="hidden")
    assert page.locator("#settings-toggle").get_attribute("aria-expanded") == "false"

    # API keys from the drawer: the dialog fits the phone; Escape closes it, focus returns to the menu.
    menu.tap()
    page.locator("#keys-open").tap()
    dialog = page.locator(".keys-dialog")
    dialog.get_by_text("No keys yet.").wait_for()
    drawer.wait_for(state="hidden")  # closed under the dialog
    b = dialog.bounding_box()
    assert b["x"] >= 0 and b["x"] + b["width"] <= 390, b
    page.keyboard.press("Escape")
    dialog.wait_for(state="hidden")
    assert page.evaluate("document.activeElement.id") == "menu-toggle"
    assert watch.errors == [], watch.errors


def test_on_a_phone_the_composer_stays_above_the_keyboard(site, open_page, tmp_path):
    page, watch = open_page("phone")
    open_long_chat(page, site)
    page.locator(".composer-input").tap()
    page.keyboard.type("a question typed while the keyboard is up")
    # The on-screen keyboard takes the lower part of the screen: the viewport is 500 px tall now.
    page.set_viewport_size({"width": 390, "height": 500})
    page.wait_for_function("document.documentElement.style.getPropertyValue('--app-height') === '500px'")
    page.wait_for_timeout(100)
    vv = page.evaluate("({top: visualViewport.offsetTop, height: visualViewport.height})")
    composer, head, send = box(page, ".composer-box"), box(page, ".chat-head"), box(page, ".send")
    assert vv["top"] <= composer["y"] and composer["y"] + composer["height"] <= vv["top"] + vv["height"], (composer, vv)
    assert composer["y"] + composer["height"] >= vv["height"] - 40  # still at the foot, not mid-screen
    assert head["y"] >= vv["top"] and head["y"] + head["height"] < composer["y"]  # header still on screen
    # The page itself does not scroll: only the message list does, between header and composer.
    assert page.evaluate("document.documentElement.scrollHeight <= document.documentElement.clientHeight")
    assert page.evaluate("(s => s.scrollHeight > s.clientHeight)(document.getElementById('scroller'))")
    assert page.evaluate("document.activeElement.classList.contains('composer-input')")
    assert_no_sideways_scroll(page, "chat with the keyboard up")
    shot = shoot(page, tmp_path, "chat-phone-keyboard")
    (send_px,) = pixels(page, shot, [centre(send)])
    assert near(send_px, ACCENT, 12), send_px
    # The keyboard goes away: the layout takes the full height again.
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function("document.documentElement.style.getPropertyValue('--app-height') === '844px'")
    page.wait_for_timeout(100)
    composer = box(page, ".composer-box")
    assert 844 - 40 <= composer["y"] + composer["height"] <= 844
    assert watch.errors == [], watch.errors


def _fake_atlas(page):
    snap = {**SNAPSHOT, "emap": {"rows": BIG_ROWS, "cols": BIG_COLS, "hex": bytes(BIG_BYTES).hex()},
            "layers": list(range(BIG_ROWS)), "entropy": [5.0] * BIG_ROWS,
            "repin": [{"layer": r, "expert": 127, "old_tier": 1, "gpu": 0} for r in range(8)]}
    history = [{**INFO, "id": i, "filename": f"experts-{'x' * 40}-{i}.json"} for i in (1, 2, 3)]
    bodies = {"atlases": {"model": "qwen3moe-" + "x" * 40, "current": INFO, "history": history},
              "atlases/1/experts.json": DOC, "atlases/1/map": MAP, "builds": {"builds": []}}
    page.route_web_socket(re.compile(r".*/ws/atlas/$"), lambda ws: ws.send(json.dumps(snap)))
    page.route(re.compile(r".*/atlas/api/.*"), lambda route: route.fulfill(json=bodies[route.request.url.split("/atlas/api/", 1)[1]]))


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_the_atlas_page_fits(site, open_page, tmp_path, size):
    page, watch = open_page(size)
    _fake_atlas(page)
    log_in(page, site, "/atlas")
    page.wait_for_function(f"window.colibriAtlas && window.colibriAtlas.grid.rows === {BIG_ROWS} && window.colibriAtlas.grid.frames > 0")
    page.locator("#atlas-history tr").nth(2).wait_for(state="attached")
    assert_no_sideways_scroll(page, f"atlas at {size}")
    shoot(page, tmp_path, f"atlas-{size}", full_page=True)
    grid, side, canvas = box(page, ".atlas-grid-panel"), box(page, ".atlas-side"), box(page, "#atlas-grid")
    vw = page.viewport_size["width"]
    assert canvas["x"] + canvas["width"] <= grid["x"] + grid["width"]  # the whole grid fits its panel
    if size == "phone":
        assert side["y"] >= grid["y"] + grid["height"] and abs(side["x"] - grid["x"]) < 1  # stacked
        assert grid["x"] + grid["width"] <= vw
    else:
        assert side["x"] >= grid["x"] + grid["width"] and abs(side["y"] - grid["y"]) < 1  # side by side
    assert watch.errors == [], watch.errors


def _stats(n):
    rows = [{"name": "colibri_api_requests_total", "labels": {"surface": s, "status": st}, "value": 10 * n + i}
            for i, (s, st) in enumerate((s, st) for s in ("openai_chat", "openai_completion", "anthropic_messages", "openai_responses")
                                        for st in ("200", "400", "404", "429", "500", "503"))]
    return {"time": time.time(), "engine": {"up": 1, "slots": 4, "busy": 1, "queue": 0, "restarts": 0}, "io": None,
            "metrics": {"colibri_api_requests": rows}}


@pytest.mark.parametrize("size", ["phone", "desktop"])
def test_the_ops_page_fits(site, open_page, tmp_path, size):
    page, watch = open_page(size)
    polls = []
    page.route(re.compile(r".*/ops/stats\.json$"), lambda route: (polls.append(1), route.fulfill(json=_stats(len(polls)))))
    log_in(page, site, "/ops")
    page.locator("#ops-updated[data-state=live]").wait_for()
    page.wait_for_function("document.querySelectorAll('#ops-status-table tbody tr').length === 4")
    assert_no_sideways_scroll(page, f"ops at {size}")
    shoot(page, tmp_path, f"ops-{size}", full_page=True)
    charts = page.locator(".ops-chart")
    lefts = {round(charts.nth(i).bounding_box()["x"]) for i in range(charts.count())}
    vw = page.viewport_size["width"]
    if size == "phone":
        assert len(lefts) == 1  # one column
        assert all(charts.nth(i).bounding_box()["width"] <= vw for i in range(charts.count()))
    else:
        assert len(lefts) >= 3
    assert watch.errors == [], watch.errors


def test_the_phone_layout_runs_under_the_sites_csp(site, browser):
    """The drawer and the viewport tracking (an inline custom property set from script) under the
    page's enforced Content-Security-Policy: not one violation, driven with locators only."""
    context = browser.new_context(bypass_csp=False, **SIZES["phone"])
    try:
        page = context.new_page()
        page.set_default_timeout(15000)
        violations, responses = [], []
        page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
        page.on("response", lambda r: r.url.rstrip("/") == site and responses.append(r))
        FakeChat(page, conversations=(OLDER,))
        log_in(page, site)
        assert "style-src 'self'" in responses[-1].headers.get("content-security-policy", "")
        page.locator("#menu-toggle").tap()
        page.locator('.conv[data-id="3"] .conv-open').wait_for(state="visible")
        page.keyboard.press("Escape")
        page.locator("#sidebar .new-chat").wait_for(state="hidden")
        page.set_viewport_size({"width": 390, "height": 500})
        height = "document.documentElement.style.getPropertyValue('--app-height')"
        for _ in range(40):  # no wait_for_function: its predicate would be evaluated script
            if page.evaluate(height) == "500px":
                break
            page.wait_for_timeout(50)
        assert page.evaluate(height) == "500px"
        assert page.locator(".composer-box").bounding_box()["y"] + page.locator(".composer-box").bounding_box()["height"] <= 500
        assert violations == [], violations
    finally:
        context.close()
