"""Frames per second of the atlas grid in headless Chromium at GLM-5 size (78 layers x 256
experts): not a test, a measurement (issue 13).

The real page (templates/experts/atlas.html + frontend/dist/atlas.js) is served through
Playwright routes with no server: the JSON endpoints answer empty, and /ws/atlas/ is a scripted
socket that sends a synthetic EMAP (random tiers and heats) and then one HITS frame every 50 ms
(the consumer's flush interval) with 8 routed experts per layer, so every frame has cells fading.
Prints the grid's painted frames per second over SECONDS, and the page's requestAnimationFrame
rate for comparison (headless Chromium caps both at the display rate, 60).

    .venv/bin/python bench/atlas_fps.py [--rows 78] [--cols 256] [--seconds 5]
"""
import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "colibri_site.settings")
os.environ.setdefault("COLIBRI_DEV", "1")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def page_html():
    import django
    from django.template.loader import render_to_string

    django.setup()
    return render_to_string("experts/atlas.html", {"boot": {"csrf_token": "bench", "username": "bench"}})


def synthetic_emap(rows, cols, rng):
    cells = []
    for _ in range(rows * cols):
        tier = rng.choices([0, 1, 2], weights=[6, 3, 1])[0]
        cells.append((tier << 6) | rng.randint(0, 30))
    return bytes(cells).hex()


def synthetic_hits(rows, cols, rng, per_row=8):
    bits = bytearray((rows * cols + 7) // 8)
    for r in range(rows):
        for c in rng.sample(range(cols), per_row):
            i = r * cols + c
            bits[i >> 3] |= 1 << (i & 7)
    return bits.hex()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=78)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--screenshot", help="save a PNG of the page at the end")
    opts = ap.parse_args()
    from playwright.sync_api import sync_playwright

    rng = random.Random(0)
    html = page_html()
    dist = ROOT / "frontend" / "dist"
    emap = {"rows": opts.rows, "cols": opts.cols, "hex": synthetic_emap(opts.rows, opts.cols, rng)}
    hits = [synthetic_hits(opts.rows, opts.cols, rng) for _ in range(64)]
    snapshot = {"type": "snapshot", "up": True, "status": "up", "emap": emap, "busy": 1, "queue": 0,
                "tiers": {"vram_experts": 0, "ram_experts": 0, "disk_experts": 0, "vram_gb": 0, "ram_gb": 0},
                "entropy": [rng.uniform(1, 8) for _ in range(opts.rows)], "repin": [],
                "layers": list(range(3, 3 + opts.rows)), "layer_source": "bench"}
    def on_socket(ws):
        ws.send(json.dumps(snapshot))

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.route("**/atlas", lambda r: r.fulfill(status=200, content_type="text/html", body=html))
        page.route("**/static/**", lambda r: r.fulfill(path=str(dist / r.request.url.rsplit("/", 1)[1])))
        page.route("**/atlas/api/atlases", lambda r: r.fulfill(json={"model": "synthetic", "current": None, "history": []}))
        page.route("**/atlas/api/builds", lambda r: r.fulfill(json={"builds": []}))
        sockets = []
        page.route_web_socket("**/ws/atlas/", lambda ws: (on_socket(ws), sockets.append(ws)))
        page.goto("http://bench.local/atlas")
        page.wait_for_function("window.colibriAtlas && window.colibriAtlas.grid.rows > 0")
        page.evaluate("""() => { window.__raf = 0; const t = () => { window.__raf++; requestAnimationFrame(t); }; requestAnimationFrame(t); }""")
        start_frames, start_raf, start_ms = page.evaluate("[window.colibriAtlas.frames(), window.__raf, window.colibriAtlas.grid.paintMs]")
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < opts.seconds:
            sockets[0].send(json.dumps({"type": "telemetry", "windows": 1,
                                        "hits": {"rows": opts.rows, "cols": opts.cols, "hex": hits[n % len(hits)]}}))
            n += 1
            page.wait_for_timeout(50)
        frames, raf, hit_frames, paint_ms = page.evaluate("[window.colibriAtlas.frames(), window.__raf, window.colibriAtlas.hitFrames, window.colibriAtlas.grid.paintMs]")
        elapsed = time.monotonic() - t0
        if opts.screenshot:
            page.mouse.move(400, 300)
            page.screenshot(path=opts.screenshot, full_page=True)
        browser.close()
    fps = (frames - start_frames) / elapsed
    print(f"grid {opts.rows} x {opts.cols} = {opts.rows * opts.cols} cells, {n} HITS frames pushed "
          f"({hit_frames} applied) over {elapsed:.1f} s")
    print(f"painted frames per second: {fps:.1f}  (page requestAnimationFrame rate: {(raf - start_raf) / elapsed:.1f})")
    print(f"mean paint time: {(paint_ms - start_ms) / max(frames - start_frames, 1):.2f} ms per frame (16.7 ms = 60 fps budget)")


if __name__ == "__main__":
    main()
