"""Harmony through the real engine: Daphne + the bridge worker + our native engine on a tiny
gpt-oss file whose output is forced, read by the official SDKs (openai 1.109, anthropic 0.69).

The model (native/tools/make_tiny_gptoss.py --script): llama.cpp's gpt-oss layout, an o200k-style
vocabulary with harmony's special tokens, gpt-oss's own chat template (llama.cpp's
openai-gpt-oss-120b.jinja) in tokenizer.chat_template. Its weights are a construction, not a
grammar and not a fake engine: one layer whose sliding-window attention (q = 0: uniform over the
last WINDOW tokens) puts a bag of the recent tokens beside the current token's own embedding axis,
zero expert outputs, and an output head solved by least squares so that each step's argmax is the
script's next token by 60 logits. After the user turn "Say hello." it writes a harmony exchange
(analysis, then final, then <|return|>); after "Weather in Paris?" an analysis and a commentary
call to functions.get_weather ending <|call|>. Every token passes the engine's real path:
tokenizer (specials in the prompt), attention with sinks and the window, the MoE, the head,
sampling at the SDK's temperature, the specials streamed as text, <|return|>/<|call|> ending the
generation, and the bridge's harmony parser reading the channels. The generator recomputes
every scripted step's argmax in float64 before it writes the file; `test_the_engine_writes_the_script`
checks that the engine, through legacy Completions (the prompt as is, no parsing), writes the script.
"""
import json
import subprocess
import sys

import httpx
import pytest

from api.models import ApiKey
from tests.support import procs
from tests.support.reference import chat_template
from tests.web import sse_oracles as oracles
from tests.web.conftest import anthropic_client, openai_client
from tests.web.live import start_stack
from tests.web.reasoning_sdk import (ANSWER, CALL, SCHEMA, THOUGHT, chat_reasoning, messages_thinking, raw_stream,
                                     responses_reasoning, tool_call_on_every_surface)

pytestmark = pytest.mark.django_db(transaction=True)

GREET, ASK = "Say hello.", "Weather in Paris?"
OUT = (f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final<|message|>"
       f"{ANSWER}<|return|>")
WINDOW = 12  # tokens: enough to see the user turn from the analysis header, and the analysis from the final one


def _context(user: str) -> str:
    """The prompt's tail as the harmony renderer writes it (any system / developer part before it)."""
    return f"<|start|>user<|message|>{user}<|end|><|start|>assistant"


@pytest.fixture(scope="module")
def scripted_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("scripted-gptoss")
    spec = {"template": chat_template("openai-gpt-oss-120b.jinja"), "window": WINDOW,
            "exchanges": [{"context": _context(GREET), "output": OUT}, {"context": _context(ASK), "output": CALL}]}
    (d / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, str(procs.ROOT / "native" / "tools" / "make_tiny_gptoss.py"),
                    str(d / "tiny-gpt-oss.gguf"), "--script", str(d / "spec.json")], check=True)
    return d / "tiny-gpt-oss.gguf"


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, engine_binary, scripted_model, tmp_path_factory):
    with start_stack(django_db_blocker, tmp_path_factory, {"ENGINE_BINARY": str(engine_binary),
                                                           "ENGINE_MODEL": str(scripted_model), "CTX": "8192"}) as live:
        yield live


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="harmony-engine")[1]


def test_the_engine_writes_the_script(stack, key):
    """The raw output (Completions sends the prompt as is) is the script, up to the end token:
    the engine ends the generation at <|return|> / <|call|> without writing it."""
    oai = openai_client(stack.url, key)
    for user, script, end in ((GREET, OUT, "<|return|>"), (ASK, CALL, "<|call|>")):
        r = oai.completions.create(model="colibri", prompt="<|start|>system<|message|>hi<|end|>" + _context(user),
                                   max_tokens=200)
        assert r.choices[0].text == script.removesuffix(end) and r.choices[0].finish_reason == "stop"


def test_chat_reasoning_content_buffered_and_streamed(stack, key):
    """The turn sent back with its reasoning is rendered with the analysis dropped (the renderer's
    rule) and answered again; the stream's usage counts the reasoning tokens the buffered one does."""
    buffered, streamed = chat_reasoning(openai_client(stack.url, key), GREET)
    assert streamed == buffered


def test_messages_thinking_events_streamed_and_buffered(stack, key):
    messages_thinking(anthropic_client(stack.url, key), GREET)


def test_responses_reasoning_items(stack, key):
    responses_reasoning(openai_client(stack.url, key), GREET)
    raw = httpx.post(stack.url + "/v1/responses", json={"model": "colibri", "input": GREET, "stream": True},
                     headers={"Authorization": f"Bearer {key}"}, timeout=60).text
    oracles.strict_responses_events(oracles.check_responses_stream(raw))


def test_tool_call_on_every_surface(stack, key):
    """The commentary channel addressed to=functions.get_weather, ended by <|call|>; streamed on Chat too."""
    oai = openai_client(stack.url, key)
    tool_call_on_every_surface(oai, anthropic_client(stack.url, key), ASK)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": SCHEMA}}]
    chunks = list(oai.chat.completions.create(model="colibri", messages=[{"role": "user", "content": ASK}],
                                              tools=tools, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}


def test_a_script_the_window_cannot_tell_apart_is_refused(tmp_path):
    """Two exchanges whose windows agree but whose next tokens differ: the generator names the
    window instead of writing a file that would not say the script."""
    sys.path.insert(0, str(procs.ROOT / "native" / "tools"))
    import make_tiny_gptoss

    spec = {"template": "{{ messages }}", "window": 4, "exchanges": [
        {"context": _context(GREET), "output": OUT}, {"context": _context(GREET), "output": CALL}]}
    with pytest.raises(ValueError, match="widen the window"):
        make_tiny_gptoss.write_scripted(str(tmp_path / "x.gguf"), spec)


def test_raw_streams_pass_the_wire_oracles(stack, key):
    """Every record of the Chat and Messages streams of the forced exchange validates against the
    SDKs' own event types; the thinking comes in its own deltas and blocks."""
    def raw(route, body):
        return raw_stream(stack.url, key, route, body)

    msgs = [{"role": "user", "content": GREET}]
    chat = oracles.check_openai_stream(raw("/v1/chat/completions", {"model": "colibri", "messages": msgs}),
                                       "chat.completion.chunk")
    oracles.strict_openai_chunks(chat, "chat.completion.chunk")
    assert "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chat if c["choices"]) == THOUGHT
    events = oracles.check_anthropic_stream(raw("/v1/messages", {"model": "colibri", "max_tokens": 400, "messages": msgs}))
    oracles.strict_anthropic_events(events)
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["thinking", "text"]
