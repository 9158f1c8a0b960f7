"""/ops shows how the engine split its memory budget (`memory` in /ops/stats.json, the MODEL line's
split): the budget and where it came from, then its parts, and what the slots hold now (`slot_memory`,
SLOTMEM: K/V, recurrent state, checkpoints); an engine without them leaves the panel empty. The real page from Daphne under its CSP, /ops/stats.json scripted."""
import re
import time

import pytest

from tests.browser.conftest import PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SPLIT = {"budget_mb": 3891.2, "source": "cgroup", "limit_mb": 4096.0, "margin_mb": 204.8, "dense_mb": 1012.4,
         "kv_mb": 392.0, "work_mb": 301.7, "experts_mb": 2185.0, "experts_all_mb": 16800.0,
         "experts_resident": False, "expert_override": False, "prefill_rows": 4096, "prefill_chunk": 1024}
# two slots after their turns (SLOTMEM): one a hybrid's with its recurrent state and checkpoints
SLOTS = {"0": {"kv_bytes": 2_000_000, "state_bytes": 1_500_000, "checkpoints": 4, "total_bytes": 3_500_000},
         "1": {"kv_bytes": 500_000, "state_bytes": 300_000, "checkpoints": 1, "total_bytes": 800_000}}


def test_the_ops_page_shows_the_memory_budget_split(live_stack, strict_page_and_watch, django_user_model):
    page, watch = strict_page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    polls = []

    def stats(route):
        polls.append(time.monotonic())
        route.fulfill(json={"time": time.time(), "engine": {"up": 1, "slots": 2, "busy": 0, "queue": 0, "restarts": 0},
                            "io": None, "memory": None if len(polls) == 1 else SPLIT, "metrics": {},
                            "slot_memory": None if len(polls) == 1 else SLOTS})

    page.route(re.compile(r".*/ops/stats\.json$"), stats)
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/ops")
    page.locator("#ops-memory[data-state=none]").wait_for()
    assert page.locator("#mem-budget").inner_text() == "–"
    assert page.locator("#mem-slots").inner_text() == "–"

    page.locator("#ops-memory[data-state=split]").wait_for(timeout=10000)  # the next poll brings it
    assert page.locator("#ops-memory-source").inner_text() == "cgroup 4096 MiB less 205 MiB"
    assert page.locator("#mem-budget").inner_text() == "3891 MiB"
    assert page.locator("#mem-dense").inner_text() == "1012 MiB"
    assert page.locator("#mem-kv").inner_text() == "392 MiB"
    assert page.locator("#mem-work").inner_text() == "302 MiB"
    assert page.locator("#mem-experts").inner_text() == "2185 MiB of 16800 MiB"
    assert page.locator("#mem-prefill").inner_text() == "4096 / 1024"
    assert page.locator("#mem-slots").inner_text() == "4.3 MB in 2 slots (state 1.8 MB, 5 checkpoints)"
    assert watch.errors == []
