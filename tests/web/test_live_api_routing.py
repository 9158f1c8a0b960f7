"""Live: `"colibri": {"routing": true}` on the real engine (routes=1), through the official SDKs
with strict validation, buffered and streaming, on the four surfaces: the summary names the
fixture model's shape (4 MoE layers x 8 experts) and counts this request's selections."""
import anthropic
import httpx
import openai
import pytest

from api.models import ApiKey
from tests.web import sse_oracles as oracles

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
ASK = {"colibri": {"routing": True}}


def check(routing):
    assert routing["rows"] == 4 and routing["cols"] == 8, routing
    counts = routing["counts"]
    assert counts and all(0 <= r < 4 and 0 <= e < 8 and n >= 1 for r, e, n in counts)
    assert {r for r, _, _ in counts} == {0, 1, 2, 3}  # every MoE layer routed this request's tokens
    return sum(n for _, _, n in counts)


def test_routing_on_every_surface(live_stack, alice):
    key = ApiKey.issue(user=alice, name="routing")[1]
    oai = openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0, timeout=60,
                        _strict_response_validation=True)
    ant = anthropic.Anthropic(base_url=live_stack.url, api_key=key, max_retries=0, timeout=60,
                              _strict_response_validation=True)
    model = oai.models.list().data[0].id
    totals = {}

    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, temperature=0, extra_body=ASK)
    totals["chat"] = check(r.model_extra["colibri"]["routing"])
    r = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=8, extra_body=ASK)
    totals["completions"] = check(r.model_extra["colibri"]["routing"])
    m = ant.messages.create(model=model, max_tokens=8, messages=MESSAGES, extra_body=ASK)
    totals["messages"] = check(m.model_extra["colibri"]["routing"])
    resp = oai.responses.create(model=model, input="Tell me about the sea.", max_output_tokens=16, extra_body=ASK)
    totals["responses"] = check(resp.model_extra["colibri"]["routing"])

    # Streams: the final event carries it; the SDKs' strict parsing accepts every event.
    chunks = list(oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=8, stream=True, extra_body=ASK))
    check(chunks[-1].model_extra["colibri"]["routing"])
    # (the raw event stream; the messages.stream() helper rebuilds message_stop from its snapshot)
    last = list(ant.messages.create(model=model, max_tokens=8, messages=MESSAGES, stream=True, extra_body=ASK))[-1]
    assert last.type == "message_stop"
    check(last.model_extra["colibri"]["routing"])
    events = list(oai.responses.create(model=model, input="Hi", max_output_tokens=8, stream=True, extra_body=ASK))
    check(events[-1].response.model_extra["colibri"]["routing"])
    raw = httpx.post(live_stack.url + "/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                     json={"model": model, "prompt": "Once", "max_tokens": 8, "stream": True, **ASK}).text
    check(oracles.check_openai_stream(raw, "text_completion")[-1]["colibri"]["routing"])

    # Off by default: nothing asked, nothing computed.
    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)
    assert r.model_extra["colibri"]["routing"] is None
    print(f"\nrouting selections counted per buffered answer: {totals}")
