"""The model picker, the per-conversation system prompt and the engine host pickers against the
real stack with two models served (tests/web/live_models.py: bridge "main" on tiny-moe, bridge
"second" on tiny-moe-b, each a real run_bridge driving the native engine), in Chromium.

What proves it: the conversation's stored model and its reply's `stats.bridge` (the engine host
the router sent the turn to) for the picker; the engine's own prompt token count (ACCEPT) for the
system prompt; the grid's shape and the slot count each host reports for the host pickers.
"""
import time

import pytest

from chat.models import Conversation, Message
from tests.browser.conftest import PASSWORD, log_in
from tests.web.live_models import FIRST, SECOND, two_model_stack  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PICKER = "#model-slot select[name=model]"
SYSTEM = "textarea[name=system_prompt]"


@pytest.fixture
def page(two_model_stack, page_and_watch, django_user_model):  # noqa: F811
    page, watch = page_and_watch
    django_user_model.objects.create_user("mia", password=PASSWORD, is_staff=True)
    log_in(page, two_model_stack.url, "mia")
    page.evaluate("localStorage.setItem('colibri.params', JSON.stringify({temperature: 0, top_p: 1, max_tokens: 8}))")
    page.reload()
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    yield page
    assert watch.errors == [], watch.errors


def send_and_finish(page, text: str) -> Message:
    """Sends into the conversation on screen; the finished reply, as stored (a reply id the
    database did not hold before the send: the page may still be drawing an older one)."""
    known = list(Message.objects.values_list("pk", flat=True))
    page.fill(".composer-input", text)
    page.keyboard.press("Enter")
    page.wait_for_function(
        "known => [...document.querySelectorAll('.msg-assistant[data-id]')].some(r => "
        "!known.includes(Number(r.dataset.id)) && r.dataset.status && r.dataset.status !== 'streaming')",
        arg=known, timeout=60000)
    ids = [int(i) for i in page.locator(".msg-assistant[data-id]").evaluate_all("rs => rs.map(r => r.dataset.id)")]
    return Message.objects.get(pk=next(i for i in ids if i not in known))


def stored(conv: Conversation, field: str, value: str, timeout: float = 5.0) -> None:
    """Waits until the database holds `value` in the conversation's `field` (the page's PATCH)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conv.refresh_from_db()
        if getattr(conv, field) == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{field} is {getattr(conv, field)!r}, not {value!r}")


def conversation_on_screen(page) -> Conversation:
    page.wait_for_function("location.hash.startsWith('#c/')")
    return Conversation.objects.get(pk=int(page.evaluate("location.hash").split("/")[1]))


def test_the_model_picker_choice_is_the_conversations_and_survives_a_reload(page):
    picker = page.locator(PICKER)
    page.wait_for_function(f"document.querySelectorAll('{PICKER} option').length === 3")
    assert picker.locator("option").all_inner_texts() == [f"Default ({FIRST['model']})", FIRST["model"], SECOND["model"]]
    assert picker.input_value() == ""
    # A New chat: the choice travels with the first message and the turn goes to that model's bridge.
    picker.select_option(SECOND["model"])
    reply = send_and_finish(page, "Hello there")
    conv = conversation_on_screen(page)
    assert conv.model == SECOND["model"]
    assert reply.stats["bridge"] == SECOND["bridge"] and reply.status == "complete"
    page.reload()
    page.wait_for_function(f"document.querySelector('{PICKER}').value === '{SECOND['model']}'")
    # An existing conversation: the change is stored at once (PATCH) and its next turn follows it.
    picker.select_option("")
    stored(conv, "model", "")
    page.reload()
    page.wait_for_function(f"document.querySelectorAll('{PICKER} option').length === 3")
    assert page.locator(PICKER).input_value() == ""
    assert send_and_finish(page, "And again").stats["bridge"] == FIRST["bridge"]


def test_the_system_prompt_reaches_the_engine_and_is_kept_per_conversation(page):
    plain = send_and_finish(page, "hi")
    page.locator("#conv-nav .new-chat").click()
    page.locator("#settings-toggle").click()
    system = "You are a careful assistant who answers in rhyme. " * 6
    page.fill(SYSTEM, system)
    with_system = send_and_finish(page, "hi")
    conv = conversation_on_screen(page)
    assert conv.system_prompt == system
    # The engine's own count of the prompt it was given (ACCEPT): the system prompt is in it.
    grown = with_system.stats["prompt_tokens"] - plain.stats["prompt_tokens"]
    assert grown >= 40, (plain.stats, with_system.stats)
    page.reload()
    page.locator("#settings-toggle").click()
    page.wait_for_function(f"document.querySelector('{SYSTEM}').value.startsWith('You are a careful')")
    # An edit is stored when the field is left, and the next turn renders with it.
    page.fill(SYSTEM, "Be brief.")
    page.locator(".composer-input").focus()
    stored(conv, "system_prompt", "Be brief.")
    shorter = send_and_finish(page, "hi")
    assert shorter.stats["prompt_tokens"] < with_system.stats["prompt_tokens"]


def test_the_atlas_and_ops_pages_show_the_engine_host_picked(page, two_model_stack):  # noqa: F811
    base = two_model_stack.url
    page.goto(f"{base}/atlas")
    host = page.locator("#atlas-host select[name=bridge]")
    page.wait_for_function("window.colibriAtlas && window.colibriAtlas.grid.rows > 0")
    assert host.input_value() == FIRST["bridge"] and host.locator("option").count() == 2
    first_shape = page.evaluate("[window.colibriAtlas.grid.rows, window.colibriAtlas.grid.cols]")
    assert first_shape != [SECOND["rows"], SECOND["cols"]]
    page.wait_for_function("document.getElementById('atlas-model').textContent !== ''")
    first_name = page.inner_text("#atlas-model")
    host.select_option(SECOND["bridge"])
    page.wait_for_url(f"{base}/atlas?bridge={SECOND['bridge']}")
    page.wait_for_function(f"window.colibriAtlas && window.colibriAtlas.grid.rows === {SECOND['rows']} "
                           f"&& window.colibriAtlas.grid.cols === {SECOND['cols']}")
    assert page.locator("#atlas-host select[name=bridge]").input_value() == SECOND["bridge"]
    # The library panel follows the host: it names the model the second bridge serves.
    second_name = page.evaluate(f"fetch('/atlas/api/atlases?bridge={SECOND['bridge']}').then(r => r.json())")["model"]
    assert second_name != first_name
    page.wait_for_function("name => document.getElementById('atlas-model').textContent === name", arg=second_name)

    page.goto(f"{base}/ops")
    host = page.locator("#ops-host select[name=bridge]")
    page.locator("#ops-slots", has_text=f"/{FIRST['slots']} slots busy").wait_for()
    assert host.input_value() == FIRST["bridge"]
    host.select_option(SECOND["bridge"])
    page.wait_for_url(f"{base}/ops?bridge={SECOND['bridge']}")
    page.locator("#ops-slots", has_text=f"/{SECOND['slots']} slots busy").wait_for()
    assert page.locator("#ops-host select[name=bridge]").input_value() == SECOND["bridge"]
