"""An API conversation with tool calls, opened in the chat page (issue 25 item 7), on the real
stack (Daphne + bridge + native engine on the fixture model): imported from a JSON file through
the sidebar, each call shows its function name, id and pretty-printed arguments, each result
its tool's name and text, markup in any of them stays text, a bad file gets the server's message
naming the field, and "Continue" after the last result streams a reply from the engine. The keys
dialog offers the tool-call snippet (tests/web/test_live_api_snippets.py runs it)."""
import json

import pytest

from chat.models import Conversation, Message
from tests.browser.conftest import PASSWORD, log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EVIL = '<img src=x onerror="window.__pwned=1">'
CONVERSATION = {"model": "colibri", "messages": [
    {"role": "system", "content": "You answer weather questions with the get_weather tool."},
    {"role": "user", "content": "What is the weather in Paris and in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_paris", "type": "function",
         "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "note": EVIL})}},
        {"id": "call_oslo", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Os'}},
    ]},
    {"role": "tool", "tool_call_id": "call_paris", "content": json.dumps({"temperature_c": 18, "sky": EVIL})},
    {"role": "tool", "tool_call_id": "call_oslo", "content": "error: the arguments were cut"},
]}


def test_an_imported_api_conversation_shows_its_tool_calls(live_stack, page_and_watch, django_user_model, tmp_path):
    page, watch = page_and_watch
    django_user_model.objects.create_user("tom", password=PASSWORD)
    good, bad = tmp_path / "weather.json", tmp_path / "bad.json"
    good.write_text(json.dumps(CONVERSATION))
    bad.write_text(json.dumps({"messages": [CONVERSATION["messages"][1], {"role": "tool", "tool_call_id": "nope", "content": "x"}]}))
    log_in(page, live_stack.url, "tom")

    # A file the server refuses: its message names the field, nothing is added to the list.
    page.set_input_files(".import-file", str(bad))
    page.locator("#notices", has_text="messages[1].tool_call_id").wait_for()
    assert page.locator("#conv-nav .conv[data-id]").count() == 0
    # The watch records the 400 as an HTTP error: it is the one expected.
    assert [e for e in watch.errors if "/api/conversations/import" not in e and "status of 400" not in e] == []
    watch.errors.clear()

    page.set_input_files(".import-file", str(good))
    page.locator("#conv-nav .conv-active", has_text="What is the weather in Paris").wait_for()
    conv = Conversation.objects.get(owner__username="tom")
    page.wait_for_url(f"**/#c/{conv.pk}")
    calls = page.locator(".msg-assistant .tool-call")
    calls.nth(1).wait_for()
    assert calls.count() == 2

    paris = page.locator('.tool-call[data-call-id="call_paris"]')
    assert paris.locator(".tool-name").inner_text() == "get_weather"
    assert paris.locator(".tool-id").inner_text() == "call_paris"
    # Pretty-printed, two-space indents, and the markup is shown as text.
    assert paris.locator(".tool-args").inner_text() == json.dumps({"city": "Paris", "note": EVIL}, indent=2)
    assert paris.get_attribute("data-answered") == "true"
    oslo = page.locator('.tool-call[data-call-id="call_oslo"]')
    assert oslo.locator(".tool-args").inner_text() == '{"city": "Os'
    assert "not valid JSON" in oslo.inner_text()

    results = page.locator(".msg-tool")
    assert results.count() == 2
    assert results.nth(0).locator(".tool-name").inner_text() == "get_weather"
    assert results.nth(0).locator(".tool-id").inner_text() == "call_paris"
    assert results.nth(0).locator(".tool-result").inner_text() == json.dumps({"temperature_c": 18, "sky": EVIL}, indent=2)
    assert results.nth(1).locator(".tool-result").inner_text() == "error: the arguments were cut"
    assert page.locator(".msg-system").inner_text().startswith("You answer weather questions")
    assert page.locator("#messages img").count() == 0 and page.evaluate("window.__pwned") is None
    # The call turn has no text to copy and is not the reply to redo: only the last result acts.
    assert page.locator(".msg-assistant >> text=Regenerate").count() == 0
    assert page.locator(".msg-assistant >> text=Copy").count() == 0
    screenshot(page, "chat-tool-calls")

    # Continue: the engine writes the reply to the results (prompt = the imported history).
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    page.hover(".msg-tool >> nth=-1")
    page.click(".msg-tool >> nth=-1 >> text=Continue")
    reply = page.locator(".msg-assistant[data-id]").nth(1)
    reply.wait_for()
    page.wait_for_function("() => { const r = document.querySelectorAll('.msg-assistant[data-id]')[1];"
                           " return r && r.dataset.status && r.dataset.status !== 'streaming'; }", timeout=60000)
    assert reply.get_attribute("data-status") == "complete"
    # The random fixture model may end at once (an empty reply is an honest answer from it), so
    # the check is what it was given: the whole imported history, calls and results rendered in
    # the generic tool form, hundreds of tokens (the two user lines alone are ~20).
    stored = Message.objects.filter(conversation=conv, role="assistant").order_by("pk").last()
    assert stored.status == "complete" and (stored.stats.get("prompt_tokens") or 0) > 150, stored.stats
    assert page.locator(".msg-tool >> text=Continue").count() == 0  # the reply is the last turn now

    # A reload shows the same conversation from the server.
    page.reload()
    page.locator('.tool-call[data-call-id="call_oslo"]').wait_for()
    assert page.locator(".msg-tool").count() == 2 and page.locator(".msg-assistant[data-id]").count() == 2

    # The keys dialog's snippets include the tool-call example, carrying the new key.
    page.click("#keys-open")
    page.fill(".key-create input[name=name]", "tools")
    page.click(".key-create button[type=submit]")
    snippet = page.locator('.key-snippet[data-snippet="Python (openai, tools)"]')
    snippet.locator("summary").click()
    code = snippet.locator("pre").inner_text()
    secret = page.locator(".key-secret code").inner_text()
    assert secret and secret in code and "tools=tools" in code and '"name": "get_weather"' in code
    assert watch.errors == [], watch.errors
