"""The chat page's Thinking section end to end: Daphne + the bridge worker + an engine, the bridge
splitting a reasoning model's output into thinking and answer.

Which engine: a test double. The fixture model never thinks (random weights, no `<think>`), so
the scripted mux engine (tests/bridge/fake_engines/mux_fake.py, FAKE_SCRIPT=1) says the prompt's
last `<<SAY>>…<</SAY>>`, two bytes per DATA frame, slowly enough (FAKE_DELAY) that the page shows
the thinking grow before the answer starts. The served template (CHAT_TEMPLATE) is a Qwen3-style
`<think>` one written for this test, or one with harmony's markers (a gpt-oss model: the bridge
renders harmony itself and parses its analysis / final channels).
"""
import sys

import pytest

from chat.models import Message
from tests.browser.conftest import PASSWORD, log_in
from tests.browser.test_chat_live import REPLY, finished, send
from tests.support import procs
from tests.web.live import start_stack

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# As Qwen3's own: an earlier assistant turn goes back without what precedes its </think>.
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{{ m.content.split('</think>')[-1].lstrip('\n') }}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HARMONY_TEMPLATE = "{# a gpt-oss model: <|start|>role<|channel|>… (rendered by engine_bridge.harmony) #}"
THOUGHT = ("The user asks for 2 + 2. Adding two and two gives **four**; nothing tricky here, "
           "so I answer briefly. <img src=x onerror=\"window.__pwned=1\">")
ANSWER = "2 + 2 = 4."
OUTPUT = {
    "think": f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}",
    "harmony": (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>"
                f"{ANSWER}<|return|>"),
}
# Per change of the streaming reply: [its thinking's text length, its answer's length, section open].
WATCH = """() => {
  window.__seen = [];
  new MutationObserver(() => {
    const r = [...document.querySelectorAll('.msg-assistant')].pop();
    if (!r || r.dataset.status !== 'streaming') return;
    const t = r.querySelector('.thinking');
    const row = [t.hidden ? 0 : t.querySelector('.thinking-body').textContent.length,
                 r.querySelector('.msg-body').textContent.length, t.open];
    const last = window.__seen[window.__seen.length - 1];
    if (!last || last.join() !== row.join()) window.__seen.push(row);
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true, attributes: true});
}"""


@pytest.fixture(scope="module", params=["think", "harmony"])
def stack(request, django_db_setup, django_db_blocker, tmp_path_factory):
    command = f"{sys.executable} {procs.ROOT / 'tests' / 'bridge' / 'fake_engines' / 'mux_fake.py'}"
    template = THINK_TEMPLATE if request.param == "think" else HARMONY_TEMPLATE
    with start_stack(django_db_blocker, tmp_path_factory, {
            "ENGINE_COMMAND": command, "ENGINE_MODEL": "/srv/models/fake-moe.gguf", "CTX": "16384",
            "FAKE_SCRIPT": "1", "FAKE_DELAY": "0.02", "CHAT_TEMPLATE": template,
            # No MODEL line, as the real colibri binary: a chat turn then asks no routing, whose
            # SUBMIT key this scripted engine does not take.
            "FAKE_NO_MODEL": "1"}) as live:
        live.mode = request.param
        yield live


def test_the_thinking_section_streams_then_folds_and_stays_with_the_reply(stack, page_and_watch, django_user_model):
    page, watch = page_and_watch
    django_user_model.objects.create_user("alice", password=PASSWORD)
    log_in(page, stack.url, "alice")
    page.wait_for_function("document.querySelector('.engine-badge')?.textContent === 'engine ready'", timeout=60000)
    page.evaluate(WATCH)

    send(page, f"What is 2 + 2? <<SAY>>{OUTPUT[stack.mode]}<</SAY>>")
    section = page.locator(f"{REPLY} .thinking").last
    section.wait_for(state="visible")
    reply = finished(page)
    seen = page.evaluate("window.__seen")
    thinking_rows = [row for row in seen if row[0] > 0 and row[1] == 0]
    # The thinking streamed: it grew over several renders, open, before any answer text (its
    # rendered length may dip once: a closing ** turns the literal asterisks into bold).
    lengths = [row[0] for row in thinking_rows]
    assert len(set(lengths)) >= 3 and lengths[0] < lengths[-1] / 2, seen
    assert all(row[2] for row in thinking_rows), seen
    # Once the answer started, the section was folded.
    answering = [row for row in seen if row[1] > 0]
    assert answering and not any(row[2] for row in answering), seen

    assert reply.get_attribute("data-status") == "complete"
    assert reply.locator(".msg-body").inner_text().strip() == ANSWER  # no markup, no thinking in the reply
    assert section.get_attribute("open") is None
    label = section.locator(".thinking-label").inner_text()
    assert label.startswith("Thought for "), label
    body = section.locator(".thinking-body")
    assert "Adding two and two gives four" in body.text_content()  # folded: not rendered, but there
    assert body.locator("strong").text_content() == "four"  # markdown, sanitised
    assert page.locator(".msg-body img, .thinking img, [onerror]").count() == 0
    assert "thinking" in reply.locator(".msg-meta").inner_text()  # its reasoning tokens

    stored = Message.objects.get(pk=int(reply.get_attribute("data-id")))
    assert stored.text == ANSWER and stored.thinking.strip() == THOUGHT
    assert stored.stats["reasoning_tokens"] > 0

    # Kept with the message: a reload shows it folded above the reply.
    page.reload()
    page.locator(f"{REPLY}[data-status=complete] .thinking").wait_for(state="visible")
    section = page.locator(f"{REPLY} .thinking").last
    assert section.get_attribute("open") is None
    section.locator("summary").click()
    assert "Adding two and two gives four" in section.locator(".thinking-body").inner_text()
    assert page.evaluate("window.__pwned") is None
    assert watch.dialogs == [] and watch.errors == []
