"""/metrics and /v1/stats on the live stack: the bridge's figures read from its telemetry at scrape
time, and the web-side counters grow with SDK traffic (parsed by prometheus_client's parser)."""
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(url):
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_live_metrics(live_stack, alice):
    key = ApiKey.issue(user=alice, name="metrics")[1]
    before = scrape(live_stack.url)
    assert before[("colibri_engine_up", ())] == 1
    assert before[("colibri_engine_slots", ())] == int(live_stack.env["KV_SLOTS"])
    sdk = openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0)
    model = sdk.models.list().data[0].id
    r = sdk.completions.create(model=model, prompt="Once", max_tokens=5, temperature=0)
    after = scrape(live_stack.url)
    label = ("colibri_api_requests_total", (("status", "200"), ("surface", "openai_completion")))
    assert after[label] == before.get(label, 0) + 1
    out = ("colibri_api_tokens_total", (("direction", "out"), ("surface", "openai_completion")))
    assert after[out] - before.get(out, 0) == r.usage.completion_tokens
    stats = httpx.get(live_stack.url + "/v1/stats", headers={"Authorization": f"Bearer {key}"}).json()
    assert stats["engine"]["up"] == 1 and stats["surfaces"]["openai_completion"]["requests"] >= 1
