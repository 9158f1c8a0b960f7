"""/metrics (Prometheus text, parsed with prometheus_client's own parser) and /v1/stats, with a
scripted bridge: the counters of a surface increase when it serves, histograms observe."""
import json

import pytest
from django.test import AsyncClient, Client
from prometheus_client.parser import text_string_to_metric_families

from tests.web.fakes import reply, serve_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def served_up(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}, "slots": 2, "busy": 1,
             "queue": 3, "restarts": 4}
    serve_state(monkeypatch, state)
    monkeypatch.setattr("engine_bridge.telemetry.get_state", lambda bridge=None: state)
    return state


def scrape():
    r = Client().get("/metrics")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain")
    values = {}
    for family in text_string_to_metric_families(r.content.decode()):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def key(name, **labels):
    return (name, tuple(sorted(labels.items())))


async def test_counters_increase_as_surfaces_serve(fake_bridge, alice_key):
    before = scrape()
    assert before[key("colibri_engine_slots")] == 2 and before[key("colibri_queue_depth")] == 3
    assert before[key("colibri_engine_restarts_total")] == 4 and before[key("colibri_engine_up")] == 1
    fake_bridge.script(*reply("Hel", "lo"))
    auth = {"Authorization": f"Bearer {alice_key}"}
    r = await AsyncClient().post("/v1/messages", json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                             "stream": True}), content_type="application/json", headers=auth)
    b"".join([c async for c in r.streaming_content])
    r = await AsyncClient().post("/v1/completions", json.dumps({"model": "tiny", "prompt": "x", "max_tokens": -1}),
                                 content_type="application/json", headers=auth)
    assert r.status_code == 400
    after = scrape()

    def grew(name, by=1, **labels):
        k = key(name, **labels)
        assert after[k] - before.get(k, 0) == by, (k, before.get(k), after.get(k))

    grew("colibri_api_requests_total", surface="anthropic_messages", status="200")
    grew("colibri_api_requests_total", surface="openai_completion", status="400")
    grew("colibri_api_generations_total", surface="anthropic_messages", outcome="completed")
    grew("colibri_api_tokens_total", by=7, surface="anthropic_messages", direction="in")
    grew("colibri_api_tokens_total", by=2, surface="anthropic_messages", direction="out")
    grew("colibri_api_time_to_first_token_seconds_count", surface="anthropic_messages")
    grew("colibri_api_inter_token_seconds_count", surface="anthropic_messages")
    grew("colibri_api_queue_wait_seconds_count", surface="anthropic_messages")
    # Every surface's series exists before it served anything.
    assert key("colibri_api_requests_total", surface="openai_responses", status="200") in after


def test_stats_mirror_the_metrics(fake_bridge, alice_key):
    fake_bridge.script(*reply("ok"))
    Client().post("/v1/responses", json.dumps({"model": "tiny", "input": "x"}), content_type="application/json",
                  HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    stats = Client().get("/v1/stats", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()
    rows = {(row["name"], row["labels"].get("surface"), row["labels"].get("status")): row["value"]
            for row in stats["metrics"]["colibri_api_requests"]}
    assert rows[("colibri_api_requests_total", "openai_responses", "200")] >= 1
    assert scrape()[key("colibri_api_requests_total", surface="openai_responses", status="200")] == \
        rows[("colibri_api_requests_total", "openai_responses", "200")]
    assert stats["metrics"]["colibri_engine_busy_slots"][0]["value"] == 1
    assert stats["engine"] == {"up": 1, "slots": 2, "busy": 1, "queue": 3, "restarts": 4}
    summary = stats["surfaces"]["openai_responses"]
    assert summary["requests"] == sum(v for (name, surface, _), v in rows.items()
                                      if name == "colibri_api_requests_total" and surface == "openai_responses")
    assert summary["tokens_out"] >= 2 and summary["time_to_first_token_avg_s"] is not None
    assert Client().get("/v1/stats").status_code == 401


def test_prefix_reuse_and_expert_hit_are_counted(fake_bridge, alice_key):
    before = scrape()
    events = reply("ok")
    events[2] = {**events[2], "reused": 5}  # accepted: the engine kept 5 prompt tokens
    fake_bridge.script(*events)
    r = Client().post("/v1/chat/completions", json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x"}]}),
                      content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {alice_key}")
    assert r.status_code == 200
    after = scrape()
    reuse = key("colibri_api_prefix_reuse_tokens_total", surface="openai_chat")
    hits, hit_sum = key("colibri_api_expert_hit_percent_count", surface="openai_chat"), key(
        "colibri_api_expert_hit_percent_sum", surface="openai_chat")
    assert after[reuse] - before[reuse] == 5
    assert after[hits] - before[hits] == 1 and after[hit_sum] - before[hit_sum] == 90.0
    summary = Client().get("/v1/stats", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()["surfaces"]["openai_chat"]
    assert summary["prefix_reuse_tokens"] >= 5 and 0 < summary["expert_hit_pct_avg"] <= 100
    assert "inter_token_avg_s" in summary
