#!/usr/bin/env python3
"""The atlas on a big model, as an admin sees it (issue 23 item 6): screenshots, not a test.

    .venv/bin/python bench/atlas_shot.py MODEL.gguf [--expert-ram-mb 2376] [--out /tmp/atlas-shot]
                                         [--turns 2] [--max-tokens 24]

A private stack (bench/webpath.py's Stack: Daphne + bridge + engine + Celery worker) on MODEL,
with EXPERT_RAM_MB set so that the expert tiers differ (RAM vs disk). A staff user opens the
atlas in headless Chromium while chat turns stream through the API (the openai SDK). Prints,
and saves beside the PNGs as atlas-shot.json: the grid's size; how long the page took to paint;
per turn, the frames per second while tokens flow (the grid's painted frames, which rest between
tokens; the page's requestAnimationFrame rate; the grid's paint time per frame); the HITS frames
received; the REPIN entries the timeline lists at page load (it shows only changes after the page
opened, so 0) and after the turns; each tier's cell count in the page's expert map.
Screenshots: atlas-open.png (before any turn), atlas-streaming-N.png (mid-turn N),
atlas-after.png (after the turns).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
from webpath import Stack  # noqa: E402

PASSWORD = "bench-atlas-password"
GRID_READY = "() => { const a = window.colibriAtlas; return a && a.grid.rows > 0 && a.grid.frames > 0; }"
# The page's own frame rate (requestAnimationFrame callbacks), beside the frames the grid
# painted: the grid paints only while a cell fades or the map changed, so between tokens it rests.
RAF_COUNTER = "() => { window.__raf = 0; const t = () => { window.__raf++; requestAnimationFrame(t); }; requestAnimationFrame(t); }"
COUNTERS = "[window.colibriAtlas.grid.frames, window.__raf, window.colibriAtlas.grid.paintMs]"
TIERS = """() => { const g = window.colibriAtlas.grid, n = {};
  for (let i = 0; i < g.rows * g.cols; i++) { const t = ['disk', 'RAM', 'VRAM'][Math.min(g.emap[i] >> 6, 2)]; n[t] = (n[t] || 0) + 1; }
  return n; }"""


def api_turn(stack: Stack, turn: int, max_tokens: int, done: threading.Event) -> None:
    """One streamed chat turn through /v1/chat/completions with the openai SDK."""
    import openai
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0, timeout=600)
    try:
        for _ in client.chat.completions.create(
                model="default", stream=True, max_tokens=max_tokens, temperature=0,
                messages=[{"role": "user", "content": f"Tell the atlas something, turn {turn + 1}."}]):
            pass
    finally:
        done.set()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--expert-ram-mb", type=int, default=2376)
    ap.add_argument("--out", type=Path, default=Path("/tmp/atlas-shot"))
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=24)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM writes beside sync Playwright's event loop
    engine_env = "KVSAVE=0,USAGE_SAVE=0" + (f",EXPERT_RAM_MB={a.expert_ram_mb}" if a.expert_ram_mb else "")
    t0 = time.monotonic()
    stack = Stack(a.model, 2, 2048, extra_env={"ENGINE_ENV": engine_env})
    ready_s = time.monotonic() - t0
    report: dict = {"model": str(a.model), "expert_ram_mb": a.expert_ram_mb, "stack_ready_s": round(ready_s, 1)}
    try:
        from django.contrib.auth import get_user_model
        from playwright.sync_api import sync_playwright
        user, _ = get_user_model().objects.get_or_create(username="atlas-admin")
        user.is_staff = True
        user.set_password(PASSWORD)
        user.save()
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            context = browser.new_context(viewport={"width": 1440, "height": 1000}, bypass_csp=True)
            atlas = context.new_page()
            errors: list[str] = []
            atlas.on("pageerror", lambda e: errors.append(str(e)))
            atlas.goto(f"{stack.url}/")
            atlas.fill("#id_username", "atlas-admin")
            atlas.fill("#id_password", PASSWORD)
            atlas.click("button[type=submit]")
            atlas.wait_for_selector("#conv-nav .new-chat")
            t_open = time.monotonic()
            atlas.goto(f"{stack.url}/atlas")
            atlas.wait_for_function(GRID_READY, timeout=60000)
            report["painted_after_open_s"] = round(time.monotonic() - t_open, 2)
            report["grid"] = atlas.evaluate("[window.colibriAtlas.grid.rows, window.colibriAtlas.grid.cols]")
            report["socket"] = atlas.locator("#socket-state").get_attribute("data-state")
            report["repin_entries_at_open"] = atlas.locator("#atlas-repin li").count()
            report["tiers_at_open"] = atlas.evaluate(TIERS)
            atlas.screenshot(path=str(a.out / "atlas-open.png"))

            atlas.evaluate(RAF_COUNTER)
            fps = []
            for turn in range(a.turns):
                # The turn goes through the API from a thread (the official SDK): a second page
                # in the browser would be the visible one, and Chromium throttles the hidden
                # atlas's frames to a few a second.
                done = threading.Event()
                threading.Thread(target=api_turn, args=(stack, turn, a.max_tokens, done), daemon=True).start()
                hits0 = atlas.evaluate("window.colibriAtlas.hitFrames")
                atlas.wait_for_function(f"window.colibriAtlas.hitFrames > {hits0 + 3}", timeout=120000)
                f0, r0, p0 = atlas.evaluate(COUNTERS)
                w0 = time.monotonic()
                atlas.wait_for_timeout(3000)
                f1, r1, p1 = atlas.evaluate(COUNTERS)
                w1 = time.monotonic()
                fps.append({"painted": round((f1 - f0) / (w1 - w0), 1), "raf": round((r1 - r0) / (w1 - w0), 1),
                            "paint_ms_per_frame": round((p1 - p0) / max(f1 - f0, 1), 2)})
                # the screenshot right after a HITS frame, while its cells still flash
                hits1 = atlas.evaluate("window.colibriAtlas.hitFrames")
                atlas.wait_for_function(f"window.colibriAtlas.hitFrames > {hits1}", timeout=120000)
                atlas.screenshot(path=str(a.out / f"atlas-streaming-{turn + 1}.png"))
                if not done.wait(600):
                    raise RuntimeError(f"turn {turn + 1} did not end within 600 s")
            atlas.wait_for_timeout(2000)
            report["painted_fps_while_streaming"] = fps
            report["hit_frames"] = atlas.evaluate("window.colibriAtlas.hitFrames")
            report["repin_entries_after"] = atlas.locator("#atlas-repin li").count()
            report["tiers_after"] = atlas.evaluate(TIERS)
            report["page_errors"] = errors
            atlas.screenshot(path=str(a.out / "atlas-after.png"))
            browser.close()
    finally:
        stack.close()
    (a.out / "atlas-shot.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
