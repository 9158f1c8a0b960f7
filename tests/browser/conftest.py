"""Playwright on Debian's chromium (peers.md §6): no `playwright install`, no network.

Two kinds of browser tests live here:
* test_chat_ui.py drives the page against a scripted websocket (Playwright's route_web_socket)
  and mocked JSON endpoints: the front end's own behaviour (sanitising, offsets, stats, errors),
  deterministic and fast;
* test_chat_live.py drives it against the real stack (Daphne + bridge + native engine).
"""
import os
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.web.live import live_stack  # noqa: F401  (the real stack, shared with tests/web)

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",  # otherwise chromium keeps trying to reach Google hosts
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery"


@pytest.fixture(scope="package")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test.sh does this)")
    if not (ROOT / "frontend" / "dist" / "app.js").exists():
        pytest.fail("frontend/dist/app.js is missing: cd frontend && npm ci && npm run build")
    # The sync Playwright API runs an event loop in this thread; ORM calls (fixtures, the test
    # database setup) would otherwise raise SynchronousOnlyOperation. Only while these tests run.
    saved = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if saved is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = saved


class PageWatch:
    """Console errors, uncaught page errors and dialogs seen during a test."""

    def __init__(self, page):
        self.errors = []
        self.dialogs = []
        self.accept_confirms = False
        page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        # Chromium's "Failed to load resource" console line omits the URL; record it here.
        page.on("response", lambda r: r.status >= 400 and self.errors.append(f"http {r.status}: {r.request.method} {r.url}"))

        def on_dialog(d):
            self.dialogs.append(f"{d.type}: {d.message}")
            if d.type == "confirm" and self.accept_confirms:
                d.accept()
            else:
                d.dismiss()

        page.on("dialog", on_dialog)


def _page(browser, bypass_csp):
    context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=bypass_csp)
    page = context.new_page()
    page.set_default_timeout(15000)
    return context, page


@pytest.fixture
def page_and_watch(browser):
    # Playwright's polling predicates (wait_for_function) compile strings in the page, which the
    # site's CSP forbids (no eval): these tests bypass it; `strict_page_and_watch` enforces it.
    context, page = _page(browser, bypass_csp=True)
    watch = PageWatch(page)
    yield page, watch
    context.close()


@pytest.fixture
def strict_page_and_watch(browser):
    """A page under the site's real Content-Security-Policy: drive it with locators only."""
    context, page = _page(browser, bypass_csp=False)
    watch = PageWatch(page)
    yield page, watch
    context.close()


def screenshot(page, name):
    """Saves a full-page screenshot under $BROWSER_SCREENSHOTS (if set), for looking at the design."""
    folder = os.environ.get("BROWSER_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"))


def log_in(page, base_url, username, password=PASSWORD):
    page.goto(f"{base_url}/")
    page.wait_for_url("**/accounts/login/**")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#conv-nav .new-chat")


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives Debian's chromium with Playwright")
