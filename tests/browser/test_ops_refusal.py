"""/ops says why the engine is down when it refused its model file (`refusal` in /ops/stats.json,
the bridge's telemetry `refused`): the engine pill reads "model refused: REASON" in the down
colours, and "engine up" again once the engine runs. The real page from Daphne under its CSP,
/ops/stats.json scripted."""
import re
import time

import pytest

from tests.browser.conftest import PASSWORD, log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
REASON = "tensor blk.0.ffn_mystery.weight is not known to this engine's qwen3moe loader (unsupported file)"


def test_the_ops_page_shows_why_the_model_was_refused(live_stack, strict_page_and_watch, django_user_model):
    page, watch = strict_page_and_watch
    django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)
    polls = []

    def stats(route):
        polls.append(time.monotonic())
        refused = len(polls) == 1
        route.fulfill(json={"time": time.time(), "engine": {"up": 0 if refused else 1, "slots": 2, "busy": 0,
                                                            "queue": 0, "restarts": 0},
                            "io": None, "memory": None, "refusal": REASON if refused else None, "metrics": {}})

    page.route(re.compile(r".*/ops/stats\.json$"), stats)
    log_in(page, live_stack.url, "sam")
    page.goto(f"{live_stack.url}/ops")
    pill = page.locator("#ops-engine[data-state=refused]")
    pill.wait_for()
    assert pill.inner_text() == f"model refused: {REASON}"
    page.locator("#ops-engine[data-state=up]").wait_for(timeout=10000)  # the next poll: the engine runs
    assert page.locator("#ops-engine").inner_text() == "engine up"
    assert watch.errors == []
