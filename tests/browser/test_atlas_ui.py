"""The atlas page against a scripted /ws/atlas/ and mocked JSON endpoints (the real page from
Daphne, no engine traffic): layer numbers come from the data, the legend counts tiers, the card
reads EMAP and the atlas, HITS flash cells, the search highlights the experts of a topic; a 30B-sized
(48 x 128) grid paints and stays painted through resizes."""
import contextlib
import json
import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine_bridge.protocol import IoStat
from tests.browser.conftest import PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# 3 MoE layers (absolute 3, 4, 5: a model with 3 leading dense layers) x 4 experts.
# Row 0: disk never routed, RAM heat 1, VRAM heat 24, disk heat 3; rows 1-2: RAM heat 5.
EMAP = {"rows": 3, "cols": 4, "hex": "0041" + "98" + "03" + "45" * 8}
SNAPSHOT = {"type": "snapshot", "up": True, "status": "up", "busy": 0, "queue": 0, "emap": EMAP, "hits": None,
            "tiers": {"vram_experts": 1, "ram_experts": 9, "disk_experts": 2, "vram_gb": 0.5, "ram_gb": 1.5},
            "entropy": [1.0, 1.5, 2.0], "repin": [], "layers": [3, 4, 5], "layer_source": "engine"}
DOC = {"categories": ["code_sql", "poetry"], "experts": {
    "3:2": {"affinity": {"code_sql": 0.9, "poetry": 0.1}, "entropy": 0.47, "top": "code_sql", "label": "specialist: code_sql"},
    "4:0": {"affinity": {"code_sql": 0.5, "poetry": 0.5}, "entropy": 1.0, "top": "code_sql", "label": "generalist"}}}
INFO = {"id": 1, "model": "glm-like", "source": "imported", "sha256": "0" * 64, "filename": "experts.json",
        "entries": 2, "specialists": 1, "categories": DOC["categories"], "validation": None, "bytes": 10,
        "created": "2026-12-01T10:00:00+00:00"}
# REPINs from before the page opened, as a snapshot could carry them (the bridge keeps the last
# 64; an engine with everything in RAM re-pins every expert its first turn routes).
HISTORY = [{"layer": 3 + r, "expert": e, "old_tier": 1, "gpu": 0} for r in range(3) for e in range(4)]
MAP = {"categories": DOC["categories"], "points": [["3:2", 0.5, 0.5, "code_sql"], ["4:0", -0.5, -0.5, "code_sql"]]}
PIXEL = """([row, col]) => {
  const g = window.colibriAtlas.grid, c = document.getElementById('atlas-grid');
  const {x, y} = g.cellCentre(row, col), k = c.width / c.clientWidth;
  return Array.from(c.getContext('2d').getImageData(Math.floor(x * k), Math.floor(y * k), 1, 1).data).slice(0, 3);
}"""
# Pixels of the charts' teal (#0f766e) in a canvas, within its CSS-pixel rows [y0, y1).
TEAL_PIXELS = """([id, y0, y1]) => {
  const c = document.getElementById(id), k = c.width / c.clientWidth;
  const d = c.getContext('2d').getImageData(0, Math.floor(y0 * k), c.width, Math.floor((y1 - y0) * k)).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (Math.abs(d[i] - 15) < 30 && Math.abs(d[i + 1] - 118) < 30 && Math.abs(d[i + 2] - 110) < 30 && d[i + 3] > 128) n++;
  return n;
}"""


def fake_server(page):
    sockets = []

    def connect(ws):
        sockets.append(ws)
        ws.send(json.dumps({**SNAPSHOT, "repin": HISTORY}))

    def http(route):
        path = route.request.url.split("/atlas/api/", 1)[1]
        body = {"atlases": {"model": "glm-like", "current": INFO, "history": [INFO]},
                "atlases/1/experts.json": DOC, "atlases/1/map": MAP, "builds": {"builds": []}}[path]
        route.fulfill(json=body)

    page.route_web_socket(re.compile(r".*/ws/atlas/$"), connect)
    page.route(re.compile(r".*/atlas/api/.*"), http)
    return sockets


def hover(page, row, col):
    box = page.locator("#atlas-grid").bounding_box()
    c = page.evaluate(f"window.colibriAtlas.grid.cellCentre({row}, {col})")
    page.mouse.move(box["x"] + c["x"], box["y"] + c["y"])
    card = page.locator("#atlas-card")
    card.wait_for(state="visible")
    return card


def field(card, name):
    return card.locator(f"[data-field={name}]").inner_text()


def test_the_atlas_page_reads_its_data(live_stack, page_and_watch, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    sockets = fake_server(page)
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/atlas")
    page.wait_for_function("window.colibriAtlas && window.colibriAtlas.grid.rows === 3 && window.colibriAtlas.doc() !== null")

    # The last layer's entropy is the maximum (2 bits of 4 experts): its bar stops below the
    # "max 2.0 bits" label, whose 14 px band holds no bar.
    assert page.evaluate(TEAL_PIXELS, ["atlas-entropy", 14, 10000]) > 0
    assert page.evaluate(TEAL_PIXELS, ["atlas-entropy", 0, 14]) == 0

    legend = page.inner_text("#atlas-legend")
    assert "VRAM: 1 experts · 0.50 GB" in legend and "RAM: 9 experts · 1.50 GB" in legend
    assert "disk: 2 experts" in legend

    card = hover(page, 0, 0)
    assert "Layer 3 · expert 0" in card.inner_text()  # row 0 is layer 3: the engine said so
    assert field(card, "tier") == "disk" and field(card, "heat") == "never routed" and field(card, "pinned") == "no"
    card = hover(page, 0, 2)
    assert field(card, "tier") == "VRAM" and field(card, "heat").startswith("≈ 2^24")
    assert field(card, "pinned") == "yes (VRAM copy)"
    assert field(card, "label") == "specialist: code_sql" and field(card, "entropy") == "0.47 bits"
    assert field(card, "affinity") == "code_sql 90.0 %, poetry 10.0 %"
    card = hover(page, 2, 3)
    assert "Layer 5" in card.inner_text() and "below the replication gate" in field(card, "label")
    page.mouse.move(1, 1)

    # HITS: row 1 expert 1 (bit 5) and row 2 expert 3 (bit 11) flash white, then fade.
    before = page.evaluate(PIXEL, [1, 1])
    sockets[0].send(json.dumps({"type": "telemetry", "windows": 1, "hits": {"rows": 3, "cols": 4, "hex": "2008"}}))
    page.wait_for_function("window.colibriAtlas.hitFrames === 1")
    assert page.evaluate("window.colibriAtlas.lastHitCells") == [5, 11]
    # Checked on every animation frame: the flash is painted on the frame after the HITS arrive and
    # fades from there, so one read right after could catch the frame before it (seen under load).
    page.wait_for_function(f"() => ({PIXEL})([1, 1]).reduce((a, b) => a + b) > {sum(before) + 100}", polling="raf", timeout=2000)
    assert page.inner_text("#hitrate-now") == "100 %"
    # One point so far, and it shows (a line through one point would paint nothing).
    assert page.evaluate(TEAL_PIXELS, ["atlas-hitrate", 0, 10000]) > 0
    page.wait_for_function("window.colibriAtlas.grid.flash[5] === 0", timeout=5000)
    assert page.evaluate(PIXEL, [1, 1]) == before
    assert page.inner_text("#hitrate-title") == "Resident share of routed experts"

    # Once the telemetry carries finished turns' own hit %, the chart plots that instead.
    sockets[0].send(json.dumps({"type": "telemetry", "turns": [{"hit_pct": 62.4}, {"hit_pct": 87.5}]}))
    page.wait_for_function("document.getElementById('hitrate-title').textContent === 'Expert cache hit % per turn'")
    assert page.inner_text("#hitrate-now") == "88 %" and "DONE's hit_pct" in page.inner_text("#hitrate-note")

    # The timeline lists only what changes after the page opened: nothing from the snapshot's
    # history, then the one REPIN pushed now, named by layer; the card says so too.
    assert page.locator("#atlas-repin li").count() == 0
    assert field(hover(page, 2, 3), "pinned") == "resident (pinned or cached)"
    page.mouse.move(1, 1)
    # REPIN names the absolute layer: 5 is row 2 here.
    sockets[0].send(json.dumps({"type": "telemetry", "repin": [{"layer": 5, "expert": 3, "old_tier": 0, "gpu": 0}]}))
    page.locator("#atlas-repin li", has_text="L5 #3: disk").wait_for()
    assert page.locator("#atlas-repin li").count() == 1
    assert field(hover(page, 2, 3), "pinned") == "yes (re-pinned this session)"
    page.mouse.move(1, 1)

    # The search highlights the experts that know a topic, on the map and in the grid.
    lit, dim = page.evaluate(PIXEL, [0, 2]), page.evaluate(PIXEL, [2, 3])
    page.fill("#atlas-search", "code_sql")
    assert page.inner_text("#search-count") == "2 experts"
    page.wait_for_function("window.colibriAtlas.grid.highlight && window.colibriAtlas.grid.highlight.size === 2")
    page.wait_for_timeout(100)
    assert page.evaluate(PIXEL, [0, 2]) == lit and sum(page.evaluate(PIXEL, [2, 3])) < sum(dim)
    assert watch.errors == []


BUILT = {**INFO, "id": 2, "source": "built", "validation": {
    "correct": 29, "total": 30, "accuracy": 0.9667, "method": "routes", "experts": 2, "top_k": 15, "n_experts": 16}}
ROUTING = {"message": 41, "conversation": 7, "role": "assistant", "rows": 3, "cols": 4,
           "counts": [[0, 2, 30], [1, 1, 3]], "experts": 2, "selections": 33,
           # its turn's IOSTAT figures (engine_bridge.protocol.IoStat.figures)
           "io": IoStat(41, 16, 48_000_000, 12_000_000, 90, 120, 0.4, 20, 15).figures()}


def test_a_built_atlas_says_its_probe_count_and_a_message_filters_the_grid(live_stack, page_and_watch, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)

    def http(route):
        path = route.request.url.split("/atlas/api/", 1)[1]
        body = {"atlases": {"model": "glm-like", "current": BUILT, "history": [BUILT]},
                "atlases/2/experts.json": DOC, "atlases/2/map": MAP, "builds": {"builds": []},
                "messages/41/routing": ROUTING}[path]
        route.fulfill(json=body)

    page.route_web_socket(re.compile(r".*/ws/atlas/$"), lambda ws: ws.send(json.dumps(SNAPSHOT)))
    page.route(re.compile(r".*/atlas/api/.*"), http)
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/atlas?message=41")
    page.wait_for_function("window.colibriAtlas && window.colibriAtlas.grid.filter && window.colibriAtlas.grid.filter.size === 2")

    page.wait_for_function("document.getElementById('atlas-method').textContent !== ''")
    method = page.inner_text("#atlas-method")
    assert method.startswith("Probed at 2 of 16 experts per token (the model serves 15)"), method
    assert "exact per-request selection counts" in method
    assert page.inner_text("#filter-text") == "message 41: 2 experts · 33 selections"
    # Its turn's expert I/O, from the engine's IOSTAT: per token 3 MB read, 750 kB ideal.
    assert page.inner_text("#filter-io") == ("Its turn's expert I/O (16 tokens): 3.0 MB read from disk per token · "
                                              "ideal 750.0 kB · hit 75.0 % · stall 25.0 ms per token · prefetch 75.0 % of 20")

    # The message's experts keep their colour (brightest = most selections), the rest are dimmed.
    assert page.evaluate("window.colibriAtlas.grid.filter.get(2)") == 30
    card = hover(page, 0, 2)
    assert field(card, "message") == "selected 30 times"
    card = hover(page, 0, 0)
    assert field(card, "message") == "not routed by this message"
    page.mouse.move(1, 1)
    dimmed = page.evaluate(PIXEL, [2, 3])
    page.click("#filter-clear")
    page.wait_for_function("window.colibriAtlas.grid.filter === null")
    page.wait_for_timeout(100)
    assert sum(page.evaluate(PIXEL, [2, 3])) > sum(dimmed)
    assert page.url.endswith("/atlas") and page.locator("#atlas-filter").is_hidden() and page.locator("#filter-io").is_hidden()
    assert watch.errors == []


# Qwen3-30B-A3B's expert geometry (48 MoE layers x 128 experts): every tier, heats 0..63.
BIG_ROWS, BIG_COLS = 48, 128
BIG_BYTES = [((r + c) % 3) << 6 | (r * 7 + c) % 64 for r in range(BIG_ROWS) for c in range(BIG_COLS)]
TIER_RGB = [(0x3a, 0x47, 0x50), (0x5a, 0x9b, 0xd8), (0x4e, 0xd6, 0xa5)]  # frontend/src/atlas/emap.ts


def cell_rgb(b):
    """The colour grid.ts paints for an EMAP byte with no flash, highlight or filter."""
    k = 0.35 + 0.65 * min((b & 63) / 24, 1)
    return [c * k for c in TIER_RGB[min(b >> 6, 2)]]


def test_a_30b_sized_grid_paints_and_stays_painted_after_a_resize(live_stack, page_and_watch, django_user_model):
    """Issue 23: on the 48 x 128 map of the 30B-shaped file the grid was blank in a full-page
    screenshot. A resize (the window's, or the viewport change a full-page screenshot makes)
    set the canvas size, which clears it, and the idle paint loop never repainted until a HITS."""
    page, watch = page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    snap = {**SNAPSHOT, "emap": {"rows": BIG_ROWS, "cols": BIG_COLS, "hex": bytes(BIG_BYTES).hex()},
            "layers": list(range(BIG_ROWS)), "entropy": [5.0] * BIG_ROWS,
            "tiers": {"vram_experts": 2048, "ram_experts": 2048, "disk_experts": 2048, "vram_gb": 1.0, "ram_gb": 1.0}}
    page.route_web_socket(re.compile(r".*/ws/atlas/$"), lambda ws: ws.send(json.dumps(snap)))
    page.route(re.compile(r".*/atlas/api/.*"), lambda route: route.fulfill(
        json={"atlases": {"model": "qwen3moe", "current": None, "history": []}, "builds": {"builds": []}}[
            route.request.url.split("/atlas/api/", 1)[1]]))
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/atlas")
    page.wait_for_function(f"window.colibriAtlas && window.colibriAtlas.grid.rows === {BIG_ROWS} && window.colibriAtlas.grid.frames > 0")
    assert page.evaluate("[window.colibriAtlas.grid.rows, window.colibriAtlas.grid.cols]") == [BIG_ROWS, BIG_COLS]
    assert "disk: 2048 experts" in page.inner_text("#atlas-legend")
    cells = [(0, 0), (0, BIG_COLS - 1), (BIG_ROWS // 2, 61), (BIG_ROWS - 1, 0), (BIG_ROWS - 1, BIG_COLS - 1)]

    def check(when):
        for r, c in cells:
            got, want = page.evaluate(PIXEL, [r, c]), cell_rgb(BIG_BYTES[r * BIG_COLS + c])
            assert all(abs(g - w) <= 1 for g, w in zip(got, want)), f"{when}: cell ({r}, {c}) is {got}, not {want}"

    check("first paint")

    def repainted(action):
        """Runs action and waits (up to 2 s) for a frame painted after it; the check tells."""
        frames = page.evaluate("window.colibriAtlas.grid.frames")
        action()
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function(f"window.colibriAtlas.grid.frames > {frames}", timeout=2000)

    # A full-page screenshot resizes the viewport (that is how the blank grid was seen), then a
    # narrower window: each time the canvas is repainted, not left cleared.
    repainted(lambda: page.screenshot(full_page=True))
    check("after a full-page screenshot")
    width = page.evaluate("document.getElementById('atlas-grid').width")
    repainted(lambda: page.set_viewport_size({"width": 1100, "height": 800}))
    assert page.evaluate("document.getElementById('atlas-grid').width") < width
    check("after the window narrowed")
    assert watch.errors == []
