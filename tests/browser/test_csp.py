"""The pages work under their own Content-Security-Policy (issue 10): a real chat turn in a page
that enforces it, driven with locators only (no evaluated script), and not one CSP violation."""
import pytest

from tests.browser.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_chat_page_runs_under_its_csp(live_stack, strict_page_and_watch, django_user_model):
    page, watch = strict_page_and_watch
    violations = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    django_user_model.objects.create_user("carol", password=PASSWORD)
    page.goto(f"{live_stack.url}/")
    page.fill("#id_username", "carol")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("#conv-nav .new-chat")
    page.locator(".engine-badge", has_text="engine ready").wait_for(timeout=60000)
    page.fill(".composer-input", "Say hello")
    page.keyboard.press("Enter")
    reply = page.locator(".msg-assistant[data-status=complete], .msg-assistant[data-status=interrupted]").last
    reply.wait_for(timeout=60000)
    assert reply.locator(".msg-body").inner_text().strip(), "the reply is empty"
    assert violations == [], violations
    assert watch.errors == [], watch.errors
