"""/ops shows the last turn's expert I/O (the engine's IOSTAT figures, `io` in /ops/stats.json):
a figure row (disk and ideal bytes per token, hit %, stall per token, prefetch accuracy) and a
chart of disk vs ideal bytes per token; an engine that sends no IOSTAT says so. The real page from
Daphne under its CSP, /ops/stats.json scripted (the engine in tests sends no IOSTAT yet)."""
import re
import time

import pytest

from engine_bridge import protocol
from tests.browser.conftest import PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
IO = protocol.IoStat(12, 20, 4000000, 1000000, 150, 200, 0.25, 40, 30).figures()


def test_the_ops_page_shows_the_last_turns_expert_io(live_stack, strict_page_and_watch, django_user_model):
    page, watch = strict_page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    polls = []

    def stats(route):
        polls.append(time.monotonic())
        route.fulfill(json={"time": time.time(), "engine": {"up": 1, "slots": 2, "busy": 0, "queue": 0, "restarts": 0},
                            "io": None if len(polls) == 1 else IO, "metrics": {}})

    page.route(re.compile(r".*/ops/stats\.json$"), stats)
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/ops")
    note = page.locator("#ops-io-note")
    note.filter(has_text="No IOSTAT from this engine yet").wait_for()
    assert page.locator("#io-disk").inner_text() == "–"

    page.locator("#ops-io[data-state=turn]").wait_for(timeout=10000)  # the next poll brings a turn
    assert page.locator("#io-disk").inner_text() == "200.0 kB"
    assert page.locator("#io-ideal").inner_text() == "50.0 kB"
    assert page.locator("#io-hit").inner_text() == "75.0 %"
    assert page.locator("#io-stall").inner_text() == "12.5 ms"
    assert page.locator("#io-prefetch").inner_text() == "75.0 % of 40"
    assert page.locator("#ops-io-turn").inner_text() == "request 12 · 20 tokens · 4.0 MB read, 0.250 s stalled"
    # The chart plots it from the interval after: disk 0.20, ideal 0.05 MB per token.
    legend = page.locator("#chart-io .legend-item .ops-value")
    legend.first.filter(has_text="0.20").wait_for(timeout=10000)
    assert legend.nth(1).inner_text() == "0.05"
    assert watch.errors == []
