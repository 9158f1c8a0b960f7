"""The fields SDKs send (issue 25 item 4) end to end: Daphne + bridge + native engine on the
fixture model, the official SDKs unmodified with strict response validation: Chat `logprobs` /
`top_logprobs` and `n`, streamed and buffered, Completions' integer `logprobs`, Anthropic
`top_k` and `messages.count_tokens`. Unit level: test_api_fields.py."""
import pytest

from api.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="fields")[1]


def check_entries(content, k, *, greedy):
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == k
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        if not e.token.startswith("bytes:"):
            assert bytes(e.bytes).decode("utf-8") == e.token
        if greedy:  # the sampled token is the most likely one
            assert abs(e.logprob - lps[0]) < 1e-3 and e.token == e.top_logprobs[0].token


def test_chat_logprobs_buffered(oai, model):
    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
                                    logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    check_entries(content, 5, greedy=True)
    if not any(e.token.startswith("bytes:") for e in content):
        assert "".join(e.token for e in content) == r.choices[0].message.content


def test_chat_logprobs_streamed(oai, model):
    chunks = list(oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True,
                                              stream_options={"include_usage": True}))
    entries = [e for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content for e in ch.logprobs.content]
    usage = [c.usage for c in chunks if c.usage][0]
    assert len(entries) == usage.completion_tokens
    check_entries(entries, 3, greedy=True)


def test_chat_n_buffered_and_streamed(oai, model):
    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=1.0, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)
    assert r.usage.completion_tokens <= 3 * 8 and r.usage.completion_tokens > 8  # summed over the choices
    again = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=1.0, n=3, seed=5)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]  # seed + i
    assert len({c.message.content for c in r.choices}) > 1  # independent samples
    text, finishes = {}, {}
    for chunk in oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=1.0, n=2,
                                             stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            text[c.index] = text.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert set(text) == {0, 1} and set(finishes) == {0, 1}


def test_completion_logprobs(oai, model):
    r = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=10, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert lp.text_offset == sorted(lp.text_offset) and all(len(t) <= 3 for t in lp.top_logprobs)


def test_anthropic_top_k_and_count_tokens(ant, model):
    greedy = ant.messages.create(model=model, max_tokens=12, temperature=0, messages=MESSAGES)
    cut = ant.messages.create(model=model, max_tokens=12, temperature=1.0, top_k=1, messages=MESSAGES)
    assert cut.content[0].text == greedy.content[0].text  # top_k=1 is greedy whatever the temperature
    system = "You are terse."
    count = ant.messages.count_tokens(model=model, system=system, messages=MESSAGES)
    made = ant.messages.create(model=model, max_tokens=1, system=system, messages=MESSAGES)
    assert count.input_tokens == made.usage.input_tokens > 0
    with_tool = ant.messages.count_tokens(model=model, system=system, messages=MESSAGES, tools=[
        {"name": "get_weather", "description": "The weather in a city",
         "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    assert with_tool.input_tokens > count.input_tokens
