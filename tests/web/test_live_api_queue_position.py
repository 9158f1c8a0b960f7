"""Live: more concurrent streams than slots. Two long streams hold both slots; then a streaming
client per surface, with the official SDKs unmodified and strict validation (openai 1.109.1,
anthropic 0.69.0), and the same four over raw HTTP. Each queued client gets its 200 with
`x-colibri-queue-position` at once, hears its position (SSE comments; Anthropic pings; the
official `response.queued`) before its first token, and — once the holders leave — its whole
answer: nothing lost, no restart."""

import anthropic
import httpx
import openai
import pytest

from api.models import ApiKey
from tests.web import sse_oracles as oracles
from tests.web.live import slots_held

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
RAW = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 16},
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 16},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 16},
    "/v1/responses": {"input": "Tell me about the sea.", "max_output_tokens": 16},
}


def test_queued_streams_hear_their_position_and_lose_nothing(live_stack, alice):
    key = ApiKey.issue(user=alice, name="queue")[1]
    headers = {"Authorization": f"Bearer {key}"}
    oai = openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0, timeout=120,
                        _strict_response_validation=True)
    ant = anthropic.Anthropic(base_url=live_stack.url, api_key=key, max_retries=0, timeout=120,
                              _strict_response_validation=True)
    # Completion chunks are not strict-validated (see test_live_api_surfaces: the SDK's type has no
    # null finish_reason); the raw oracle below checks them.
    lenient = oai.with_options()
    lenient._strict_response_validation = False
    model = oai.models.list().data[0].id
    slots = int(live_stack.env["KV_SLOTS"])
    restarts = live_stack.bridge_state().get("restarts", 0)

    with slots_held(live_stack, model, headers, slots, timeout=120):

        # Official SDKs: the 200 (and its header) arrive while the job waits.
        chat = oai.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=16,
                                                             temperature=0, stream=True)
        comp = lenient.completions.with_raw_response.create(model=model, prompt="Once upon a time", max_tokens=16,
                                                        stream=True)
        msgs = ant.messages.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=16, stream=True)
        resp = oai.responses.with_raw_response.create(model=model, input="Tell me about the sea.",
                                                      max_output_tokens=16, stream=True)
        positions = [int(r.headers["x-colibri-queue-position"]) for r in (chat, comp, msgs, resp)]
        assert positions == sorted(positions) and positions[0] >= 1, positions
        print(f"\nqueue positions told in the x-colibri-queue-position header: {positions}")

        # Raw HTTP: the position comes before the first token on every surface.
        raws = {}
        opened = []
        for route, body in RAW.items():
            cm = httpx.stream("POST", live_stack.url + route, json={"model": model, **body, "stream": True},
                              headers=headers, timeout=120)
            r = cm.__enter__()
            opened.append(cm)
            assert r.status_code == 200 and int(r.headers["x-colibri-queue-position"]) >= 1
            raws[route] = r

    # The SDKs parse every event strictly; the comments, pings and response.queued pass.
    text = "".join(c.choices[0].delta.content or "" for c in chat.parse() if c.choices)
    assert text
    finishes = [c.choices[0].finish_reason for c in comp.parse() if c.choices]
    assert finishes[-1] in ("stop", "length")
    names = [e.type for e in msgs.parse()]
    assert names[0] == "message_start" and names[-1] == "message_stop" and "ping" not in names
    events = list(resp.parse())
    assert [e.type for e in events[:3]] == ["response.created", "response.queued", "response.in_progress"]
    assert events[0].response.status == "queued" and events[-1].type in ("response.completed", "response.incomplete")

    for route, r in raws.items():
        raw = r.read().decode()
        first_data = raw.index("data:")
        assert raw.index(": queued position=") < first_data or route == "/v1/messages"
        if route == "/v1/chat/completions":
            oracles.strict_openai_chunks([p for p in oracles.check_openai_stream(raw, "chat.completion.chunk")
                                          if p["choices"]], "chat.completion.chunk")
        elif route == "/v1/completions":
            oracles.check_openai_stream(raw, "text_completion")
        elif route == "/v1/messages":
            events = oracles.check_anthropic_stream(raw)
            oracles.strict_anthropic_events(events)
            assert events[0]["type"] == "ping" and events[0]["colibri"]["queue_position"] >= 1
        else:
            oracles.strict_responses_events(oracles.check_responses_stream(raw))
    for cm in opened:
        cm.__exit__(None, None, None)
    assert live_stack.bridge_state().get("restarts", 0) == restarts
