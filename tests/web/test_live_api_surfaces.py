"""Legacy Completions, Anthropic Messages and OpenAI Responses end to end: Daphne + bridge +
native engine on the fixture model, with the official SDKs unmodified (openai 1.109.1,
anthropic 0.69.0), buffered and streaming, strict response validation where the SDK offers it,
and the wire-level event-order oracles on the raw streams."""
import anthropic
import httpx
import openai
import pytest

from api.models import ApiKey
from tests.web import sse_oracles as oracles

pytestmark = pytest.mark.django_db(transaction=True)
PROMPT = "Tell me about the sea."
MESSAGES = [{"role": "user", "content": PROMPT}]


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="surfaces")[1]


def raw_stream(live_stack, key, route, body):
    with httpx.stream("POST", live_stack.url + route, json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {key}", "Accept": "application/json"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        return r.read().decode()


# --- models -------------------------------------------------------------------------------------

def test_both_sdks_list_the_model_by_a_typeable_id(oai, ant, model):
    assert model == model.lower() and " " not in model and "(" not in model
    pages = list(ant.models.list())  # the pager ends (has_more is false)
    assert [m.id for m in pages] == [model] and pages[0].display_name
    assert oai.models.retrieve(model).id == model
    assert ant.models.retrieve(pages[0].display_name).id == model


# --- legacy Completions -------------------------------------------------------------------------

def test_completions_buffered_and_streamed(live_stack, key, oai, model):
    r = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].finish_reason in ("stop", "length") and 0 < r.usage.completion_tokens <= 8
    # Not strict: the SDK's Completion type (reused for chunks) has no null finish_reason, which
    # every official stream chunk but the last carries; the raw check below covers the rest.
    lenient = oai.with_options()
    lenient._strict_response_validation = False
    chunks = list(lenient.completions.create(model=model, prompt="Once upon a time", max_tokens=8, stream=True,
                                             stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens <= 8
    raw = raw_stream(live_stack, key, "/v1/completions", {"model": model, "prompt": "Once", "max_tokens": 8})
    parsed = oracles.check_openai_stream(raw, "text_completion")
    oracles.strict_openai_chunks(parsed, "text_completion")


def test_completions_budget_stop_is_length(oai, model):
    r = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=3, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


# --- Anthropic Messages -------------------------------------------------------------------------

def test_messages_buffered(ant, model):
    m = ant.messages.create(model=model, max_tokens=8, messages=MESSAGES, system="Be brief.", temperature=0)
    assert m.type == "message" and m.id.startswith("msg_") and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens") and 0 < m.usage.output_tokens <= 8
    assert m.usage.input_tokens > 0 and m.content[0].type == "text"


def test_messages_budget_stop_is_max_tokens(ant, model):
    m = ant.messages.create(model=model, max_tokens=3, messages=MESSAGES, temperature=0)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_messages_stream_with_the_sdk_helper(live_stack, key, ant, model):
    with ant.messages.stream(model=model, max_tokens=16, messages=MESSAGES, temperature=0) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].text == text and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    raw = raw_stream(live_stack, key, "/v1/messages", {"model": model, "messages": MESSAGES, "max_tokens": 16})
    oracles.strict_anthropic_events(oracles.check_anthropic_stream(raw))


def test_messages_zero_budget_prewarms(ant, model):
    m = ant.messages.create(model=model, max_tokens=0, messages=MESSAGES)
    assert m.stop_reason == "max_tokens" and m.content == [] and m.usage.output_tokens == 0


def test_messages_errors_in_the_anthropic_shape(live_stack, ant, model):
    with pytest.raises(anthropic.BadRequestError) as exc:
        ant.messages.create(model=model, max_tokens=-1, messages=MESSAGES)
    assert "max_tokens must be >= 0" in str(exc.value) and exc.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.create(model="gpt-9", max_tokens=4, messages=MESSAGES)
    bad = anthropic.Anthropic(base_url=live_stack.url, api_key="col-00000000-nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=model, max_tokens=4, messages=MESSAGES)
    words = int(live_stack.env["CTX"]) + 16
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": "word " * words}])


# --- OpenAI Responses ---------------------------------------------------------------------------

def test_responses_buffered(oai, model):
    r = oai.responses.create(model=model, input=PROMPT, instructions="Be brief.", max_output_tokens=8,
                             temperature=0, extra_headers={"Idempotency-Key": "k1"})
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens <= 8 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_responses_budget_stop_is_incomplete(oai, model):
    r = oai.responses.create(model=model, input=PROMPT, max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


def test_responses_stream_with_the_sdk(live_stack, key, oai, model):
    events = list(oai.responses.create(model=model, input=[{"role": "user", "content": PROMPT}],
                                       max_output_tokens=4000, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    with oai.responses.stream(model=model, input=PROMPT, max_output_tokens=4000, temperature=0) as s:
        seen = list(s)
        deltas = [e.delta for e in seen if e.type == "response.output_text.delta"]
        if seen[-1].type == "response.completed":  # the helper raises for any other ending
            assert s.get_final_response().output_text == "".join(deltas)
    raw = raw_stream(live_stack, key, "/v1/responses", {"model": model, "input": PROMPT, "max_output_tokens": 16})
    oracles.strict_responses_events(oracles.check_responses_stream(raw))


def test_responses_refuses_durable_references(oai, model):
    with pytest.raises(openai.BadRequestError) as exc:
        oai.responses.create(model=model, input=PROMPT, previous_response_id="resp_123")
    assert exc.value.param == "previous_response_id" and "replay full input" in exc.value.message


# --- OpenAI Chat (the SDK tests are in test_live_api.py): the raw stream, every chunk strictly ----

def test_chat_raw_stream_passes_the_oracle_and_the_sdk_types(live_stack, key, oai, model):
    raw = raw_stream(live_stack, key, "/v1/chat/completions",
                     {"model": model, "messages": MESSAGES, "max_tokens": 16, "stream_options": {"include_usage": True}})
    parsed = oracles.check_openai_stream(raw, "chat.completion.chunk")
    oracles.strict_openai_chunks(parsed, "chat.completion.chunk")
    assert parsed[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    r = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4)  # strict client
    assert r.choices[0].finish_reason in ("stop", "length")
