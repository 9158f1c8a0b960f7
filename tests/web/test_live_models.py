"""Many models on every surface (issue 26 item 3), end to end: Daphne and two real bridges, each
driving the native engine on its own fixture model file (tests/web/live_models.py), called with
the official openai and anthropic SDKs. Every model served is listed with its own facts, an
unknown name is the surface's own 404, a request naming a model is answered by the bridge that
serves it (the `x-colibri-bridge` header names the engine host, checked against the registry),
and /health and /v1/stats report per bridge and per model."""
import anthropic
import httpx
import openai
import pytest

from api.models import ApiKey
from tests.web.conftest import anthropic_client, openai_client
from tests.web.live_models import FIRST, SECOND, two_model_stack  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="models")[1]


@pytest.fixture
def oai(two_model_stack, key):  # noqa: F811
    return openai_client(two_model_stack.url, key)


@pytest.fixture
def ant(two_model_stack, key):  # noqa: F811
    return anthropic_client(two_model_stack.url, key)


def test_both_sdks_list_every_served_model_with_its_own_facts(oai, ant):
    listed = oai.models.list().data
    assert [m.id for m in listed] == [FIRST["model"], SECOND["model"]]
    assert all(m.owned_by == "colibri" and m.model_extra["context_length"] > 0 for m in listed)
    assert [m.model_extra["bridges"] for m in listed] == [[FIRST["bridge"]], [SECOND["bridge"]]]
    assert [m.id for m in ant.models.list()] == [FIRST["model"], SECOND["model"]]
    assert oai.models.retrieve(SECOND["model"]).id == SECOND["model"]
    assert ant.models.retrieve(SECOND["model"]).id == SECOND["model"]
    with pytest.raises(openai.NotFoundError) as missing:
        oai.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found" and missing.value.body["param"] == "model"


def test_an_unknown_model_is_the_surfaces_own_404_naming_the_models_served(oai, ant):
    calls = [
        lambda: oai.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4),
        lambda: oai.completions.create(model="no-such-model", prompt="Once", max_tokens=4),
        lambda: oai.responses.create(model="no-such-model", input="Once", max_output_tokens=4),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as refused:
            call()
        body = refused.value.body
        assert body["code"] == "model_not_found" and body["param"] == "model", body
        assert FIRST["model"] in body["message"] and SECOND["model"] in body["message"]
    for call in (lambda: ant.messages.create(model="no-such-model", messages=MESSAGES, max_tokens=4),
                 lambda: ant.messages.count_tokens(model="no-such-model", messages=MESSAGES)):
        with pytest.raises(anthropic.NotFoundError) as refused:
            call()
        assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "not_found_error"
        assert "no-such-model" in refused.value.body["error"]["message"]


def _bridge_of(raw) -> str:
    return raw.headers["x-colibri-bridge"]


@pytest.mark.parametrize("target", [FIRST, SECOND], ids=["first", "second"])
def test_a_request_naming_a_model_is_answered_by_that_models_bridge(two_model_stack, oai, ant, target):  # noqa: F811
    model, bridge = target["model"], target["bridge"]
    assert two_model_stack.models[model] == bridge
    chat = oai.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=4, temperature=0)
    assert _bridge_of(chat) == bridge and chat.parse().model == model
    text = oai.completions.with_raw_response.create(model=model, prompt="Once upon", max_tokens=4)
    assert _bridge_of(text) == bridge and text.parse().model == model
    resp = oai.responses.with_raw_response.create(model=model, input="Once upon", max_output_tokens=4)
    assert _bridge_of(resp) == bridge and resp.parse().model == model
    msg = ant.messages.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=4)
    assert _bridge_of(msg) == bridge and msg.parse().model == model
    with oai.chat.completions.with_streaming_response.create(model=model, messages=MESSAGES, max_tokens=4,
                                                               stream=True) as stream:
        assert _bridge_of(stream) == bridge
        assert {chunk.model for chunk in stream.parse()} == {model}
    count = ant.messages.with_raw_response.count_tokens(model=model, messages=MESSAGES)
    assert _bridge_of(count) == bridge and count.parse().input_tokens > 0


def test_the_default_aliases_go_to_the_default_model(oai):
    chat = oai.chat.completions.with_raw_response.create(model="default", messages=MESSAGES, max_tokens=2)
    assert _bridge_of(chat) == FIRST["bridge"] and chat.parse().model == FIRST["model"]


def test_health_and_stats_report_per_bridge_and_per_model(two_model_stack, key):  # noqa: F811
    health = httpx.get(two_model_stack.url + "/health", timeout=10).json()
    assert health["engine"] == "up" and health["bridge_id"] == FIRST["bridge"]
    by_id = {b["id"]: b for b in health["bridges"]}
    assert sorted(by_id) == [FIRST["bridge"], SECOND["bridge"]]
    for want in (FIRST, SECOND):
        b = by_id[want["bridge"]]
        assert b["model"] == want["model"] and b["slots"] == want["slots"] and b["status"] == "up"
        assert b["host"] and 0 <= b["busy"] <= b["slots"] and b["queued"] >= 0
    assert [(m["id"], m["bridges"], m["slots"]) for m in health["models"]] == [
        (FIRST["model"], [FIRST["bridge"]], FIRST["slots"]), (SECOND["model"], [SECOND["bridge"]], SECOND["slots"])]
    auth = {"Authorization": f"Bearer {key}"}
    stats = httpx.get(two_model_stack.url + "/v1/stats", headers=auth, timeout=10).json()
    assert stats["bridge"] == FIRST["bridge"] and stats["engine"]["slots"] == FIRST["slots"]
    assert [b["id"] for b in stats["bridges"]] == [FIRST["bridge"], SECOND["bridge"]]
    assert [m["id"] for m in stats["models"]] == [FIRST["model"], SECOND["model"]]
    second = httpx.get(two_model_stack.url + "/v1/stats?bridge=second", headers=auth, timeout=10).json()
    assert second["bridge"] == SECOND["bridge"] and second["engine"]["slots"] == SECOND["slots"]
    gone = httpx.get(two_model_stack.url + "/v1/stats?bridge=gone", headers=auth, timeout=10)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "bridge_not_found"
    assert gone.json()["error"]["param"] == "bridge" and "'gone'" in gone.json()["error"]["message"]
