"""Live: the token-per-minute bucket on the real stack with the official SDKs. Two concurrent
streams whose budgets together exceed the key's limit: one is admitted, the other gets 429 at
once (the budget is charged at admission, so they cannot both pass on one minute's allowance);
the SDKs raise their RateLimitError with Retry-After and the rate-limit headers they expose."""
import threading

import anthropic
import openai
import pytest

from api.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def test_concurrent_budgets_cannot_overshoot_the_token_limit(live_stack, alice):
    row, key = ApiKey.issue(user=alice, name="tpm")
    ApiKey.objects.filter(pk=row.pk).update(tokens_per_minute=1000)
    oai = openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0, timeout=60,
                        _strict_response_validation=True)
    model = oai.models.list().data[0].id
    results, go = [None, None], threading.Event()

    def stream(i):
        go.wait()
        try:
            raw = oai.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=700,
                                                                temperature=0, stream=True)
            results[i] = ("ok", raw.headers, "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices))
        except openai.RateLimitError as exc:
            results[i] = ("429", exc.response.headers, exc.body)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    kinds = sorted(r[0] for r in results)
    assert kinds == ["429", "ok"], results
    ok = next(r for r in results if r[0] == "ok")
    refused = next(r for r in results if r[0] == "429")
    assert ok[2] and ok[1]["x-ratelimit-limit-tokens"] == "1000" and int(ok[1]["x-ratelimit-remaining-tokens"]) < 300
    assert int(refused[1]["retry-after"]) >= 1 and refused[1]["x-ratelimit-limit-tokens"] == "1000"
    assert refused[2]["code"] == "rate_limit_exceeded"
    print(f"\n2 concurrent streams x 700-token budgets on a 1000 tokens/min key: {kinds}; "
          f"admitted left {ok[1]['x-ratelimit-remaining-tokens']}, refused: retry-after {refused[1]['retry-after']} s")

    # Anthropic's SDK: its own error class and headers, on the same key's bucket.
    ant = anthropic.Anthropic(base_url=live_stack.url, api_key=key, max_retries=0, timeout=60)
    with pytest.raises(anthropic.RateLimitError) as exc:
        ant.messages.create(model=model, max_tokens=990, messages=MESSAGES)
    headers = exc.value.response.headers
    assert int(headers["retry-after"]) >= 1 and headers["anthropic-ratelimit-tokens-limit"] == "1000"
    assert exc.value.body["error"]["type"] == "rate_limit_error"
