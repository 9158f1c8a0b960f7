#!/usr/bin/env python3
"""How long after the engine's first token a person sees the reply's first text (issue 14).
A benchmark, not a test.

    .venv/bin/python bench/chat_latency.py [--model tiny|default|PATH] [--messages 15]

Headless Debian chromium (Playwright) on the chat page of a private stack (bench/webpath.py's
Stack: Daphne + bridge + engine). A MutationObserver stamps the wall-clock time at which the
streaming reply's body first shows text; the bridge stamps when it read the first text from the
engine (`stats.first_token_at` in the stored message). Same machine, same clock: the difference
is what the web path adds (bridge -> Redis -> relay -> group -> websocket -> render). Prints each
message's figure and the median.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from webpath import Stack  # noqa: E402

from tests.support import procs  # noqa: E402

PASSWORD = "bench-latency-password"
OBSERVE = """() => {
  window.__firstText = {};
  new MutationObserver(() => {
    for (const r of document.querySelectorAll('.msg-assistant[data-id]')) {
      const id = r.dataset.id;
      if (window.__firstText[id]) continue;
      const body = r.querySelector('.msg-body');
      if (body && body.textContent.trim() && !body.querySelector('.typing'))
        window.__firstText[id] = performance.timeOrigin + performance.now();
    }
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
}"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--messages", type=int, default=15)
    args = ap.parse_args()
    model = {"tiny": lambda: procs.make_tiny_model(Path("/tmp/webpath-tiny.gguf")),
             "default": lambda: ROOT / "models/smollm2-135m-moe16.gguf"}.get(args.model, lambda: Path(args.model))()
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # ORM reads beside sync Playwright's event loop
    stack = Stack(model, 2, 2048)
    try:
        from django.contrib.auth import get_user_model
        user, _ = get_user_model().objects.get_or_create(username="latency")
        user.set_password(PASSWORD)
        user.save()
        from playwright.sync_api import sync_playwright

        from chat.models import Message
        added = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            page = browser.new_context(bypass_csp=True).new_page()
            page.goto(f"{stack.url}/")
            page.fill("#id_username", "latency")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_selector("#conv-nav .new-chat")
            page.evaluate("localStorage.setItem('colibri.params', JSON.stringify({temperature: 0, top_p: 1, max_tokens: 64}))")
            page.reload()
            page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
            page.evaluate(OBSERVE)
            for i in range(args.messages):
                page.click("#conv-nav .new-chat")  # a fresh conversation each time: no growing context
                page.fill(".composer-input", f"Tell me something about number {i}.")
                page.keyboard.press("Enter")
                page.locator(".msg-assistant[data-status=complete], .msg-assistant[data-status=error], "
                             ".msg-assistant[data-status=interrupted]").last.wait_for(timeout=60000)
                msg_id = page.locator(".msg-assistant[data-id]").last.get_attribute("data-id")
                seen = page.evaluate(f"window.__firstText[{msg_id!r}]")
                engine = Message.objects.get(pk=int(msg_id)).stats.get("first_token_at")
                if seen and engine:
                    added.append(seen / 1000 - engine)
                    print(f"message {i + 1}: first text on screen {added[-1] * 1000:+.1f} ms after the engine's first token",
                          flush=True)
            browser.close()
        print(f"\nmodel {model.name}: median {statistics.median(added) * 1000:+.1f} ms, "
              f"max {max(added) * 1000:+.1f} ms over {len(added)} messages")
    finally:
        stack.close()


if __name__ == "__main__":
    main()
