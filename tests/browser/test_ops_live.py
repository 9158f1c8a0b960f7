"""The operator's page (/ops) on the real stack, under the site's enforced CSP: a staff user
finds it in the navigation, sees the charts drawn, sends API traffic, and sees the figures move
(the requests table, the request-rate and token charts); a member gets 403. Driven with
locators only (no page-side eval), so nothing bypasses the CSP."""
import time

import httpx
import pytest

from api.models import ApiKey
from tests.browser.conftest import PASSWORD, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def wait_until(predicate, timeout=20.0, step=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError("timed out waiting for the page")


def test_staff_watch_the_figures_move(live_stack, browser, django_user_model):
    sam = django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    django_user_model.objects.create_user("mia", password=PASSWORD)
    key = ApiKey.issue(user=sam, name="ops")[1]
    context = browser.new_context(viewport={"width": 1280, "height": 1000}, bypass_csp=False)
    page = context.new_page()
    page.set_default_timeout(15000)
    errors, csp = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("console", lambda m: "Content Security Policy" in m.text and csp.append(m.text))
    log_in(page, live_stack.url, "sam")
    page.click("a:has-text('Operations')")  # the staff link in the navigation
    page.wait_for_url("**/ops")
    assert page.locator(".ops-chart canvas").count() >= 10
    requests_chart = page.locator("#chart-requests canvas")
    # Two polls give the first interval: every chart has drawn a point.
    wait_until(lambda: int(requests_chart.get_attribute("data-points") or 0) >= 1)
    assert page.locator("#ops-engine").inner_text() == "engine up"
    before = float(page.locator("#ops-requests-total").get_attribute("data-total"))

    headers = {"Authorization": f"Bearer {key}"}
    model = httpx.get(live_stack.url + "/v1/models", headers=headers).json()["data"][0]["id"]
    for _ in range(3):
        r = httpx.post(live_stack.url + "/v1/chat/completions", headers=headers, timeout=60,
                       json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        assert r.status_code == 200
    r = httpx.post(live_stack.url + "/v1/messages", headers=headers, timeout=60,
                   json={"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    assert r.status_code == 200

    # The table and the charts follow within a few polls.
    wait_until(lambda: float(page.locator("#ops-requests-total").get_attribute("data-total")) >= before + 4)
    chat_row = page.locator("#ops-status-table tr[data-surface=openai_chat] td.ops-total")
    assert int(chat_row.inner_text()) >= 3

    def ever_positive(chart, index):
        # The chart's legend keeps the latest value; a rate is > 0 in the interval that saw traffic.
        value = page.locator(f"#chart-{chart} .legend-item >> nth={index} >> .ops-value").inner_text()
        return value not in ("–", "0", "0.0", "0.00")

    seen = {"requests": False, "tokens": False, "ttft": False}
    deadline = time.monotonic() + 20
    while not all(seen.values()) and time.monotonic() < deadline:
        seen["requests"] |= ever_positive("requests", 0)
        seen["tokens"] |= ever_positive("tokens", 1)
        seen["ttft"] |= ever_positive("ttft", 0)
        time.sleep(0.2)
    assert all(seen.values()), seen
    assert int(requests_chart.get_attribute("data-draws")) >= 2
    screenshot(page, "ops")
    assert not errors, errors
    assert not csp, csp
    context.close()

    # A member: 403, no charts.
    member = browser.new_context()
    mpage = member.new_page()
    log_in(mpage, live_stack.url, "mia")
    assert mpage.locator("a:has-text('Operations')").count() == 0
    response = mpage.goto(f"{live_stack.url}/ops")
    assert response.status == 403 and mpage.locator(".ops-chart").count() == 0
    member.close()
