"""The bridge worker (manage.py run_bridge) against the real engine on the fixture model,
through its real Redis transport (engine_bridge/transport.py)."""
import asyncio
import contextlib
import uuid

import pytest

from engine_bridge import liveness, transport
from engine_bridge.client import cancel, generate
from engine_bridge.request import GenerationRequest
from tests.bridge.helpers import CHATML, collect, final, text_of

pytestmark = pytest.mark.usefixtures("real_bridge")


async def test_it_streams_a_request_with_contiguous_seq():
    req = uuid.uuid4().hex
    job = {"prompt": CHATML.format("Hello there"), "max_tokens": 12}
    boot = await liveness.aget_boot()
    await transport.to_bridge({"type": "gen.submit", "req": req, "boot": boot, "job": job})
    messages = []
    while not messages or messages[-1]["events"][-1]["kind"] not in ("done", "error"):
        messages.extend(await asyncio.wait_for(transport.replies(req), 30))
    assert [m["seq"] for m in messages] == list(range(len(messages)))
    events = [e for m in messages for e in m["events"]]
    assert events[0]["kind"] == "accepted" and events[0]["prompt_tokens"] > 0
    done = events[-1]
    assert done["kind"] == "done", done
    assert done["finish_reason"] == "length"
    assert done["usage"]["completion_tokens"] == 12
    assert done["stats"]["ttft_s"] is not None and done["stats"]["tok_s"] > 0
    assert text_of(events)


async def test_it_yields_submitted_first_and_reports_telemetry():
    events = await collect(GenerationRequest(prompt=CHATML.format("Hi"), max_tokens=4))
    assert events[0]["kind"] == "submitted" and events[0]["req"]
    assert final(events)["kind"] == "done"
    from engine_bridge.telemetry import aget_state
    for _ in range(20):  # telemetry writes are throttled to ~10/s
        state = await aget_state()
        if state["hits"] is not None:
            break
        await asyncio.sleep(0.1)
    assert state["up"] and state["model"]["name"] and state["emap"]["rows"] > 0
    assert state["hits"] is not None and state["seq"] > 0


async def test_it_runs_two_conversations_concurrently():
    a, b = await asyncio.gather(
        collect(GenerationRequest(prompt=CHATML.format("The quick brown fox"), max_tokens=10,
                                  conversation_key="conv:a")),
        collect(GenerationRequest(prompt=CHATML.format("What is the capital of France?"),
                                  max_tokens=10, conversation_key="conv:b")))
    assert final(a)["kind"] == final(b)["kind"] == "done"
    slot_a = next(e["slot"] for e in a if e["kind"] == "accepted")
    slot_b = next(e["slot"] for e in b if e["kind"] == "accepted")
    assert slot_a != slot_b


async def test_it_cancels_mid_stream_and_the_slot_is_reusable():
    request = GenerationRequest(prompt=CHATML.format("Tell me a long story"), max_tokens=2000,
                                conversation_key="conv:cancel")
    events = []
    async with contextlib.aclosing(generate(request)) as stream:
        async for event in stream:
            events.append(event)
            if event["kind"] == "accepted":   # ACCEPT precedes prefill: the cancel lands mid-stream
                await cancel(events[0]["req"])
    assert final(events)["code"] == "CANCELLED"
    again = await collect(GenerationRequest(prompt=CHATML.format("Tell me a long story"),
                                            max_tokens=4, conversation_key="conv:cancel"))
    assert final(again)["kind"] == "done"


async def test_it_trims_at_a_stop_string():
    prompt = "hello world"  # greedy output of the fixture model: "ldldld..."
    first = await collect(GenerationRequest(prompt=prompt, max_tokens=12))
    full = text_of(first)
    # a 2-char stop string that first occurs after some text (so the trim is visible)
    k = next(k for k in range(1, len(full) - 1) if full.find(full[k:k + 2]) == k)
    stop = full[k:k + 2]
    events = await collect(GenerationRequest(prompt=prompt, max_tokens=12, stop=["zzz", stop]))
    done = final(events)
    assert done["kind"] == "done" and done["finish_reason"] == "stop"
    assert text_of(events) == full[:k] and full[:k]


async def test_it_reports_context_exceeded():
    events = await collect(GenerationRequest(prompt="word " * 2500, max_tokens=4))
    err = final(events)
    assert err["code"] == "CONTEXT_EXCEEDED"
    assert err["n"] > err["limit"] and err["limit"] == 2046


async def test_it_returns_a_conversation_to_its_slot_with_reused_prefix():
    turn1 = CHATML.format("Give me three tips for staying healthy")
    first = await collect(GenerationRequest(prompt=turn1, max_tokens=8, conversation_key="conv:warm"))
    assert final(first)["kind"] == "done"
    turn2 = turn1 + text_of(first) + "<|im_end|>\n" + CHATML.format("And one more?")
    second = await collect(GenerationRequest(prompt=turn2, max_tokens=4, conversation_key="conv:warm"))
    acc1 = next(e for e in first if e["kind"] == "accepted")
    acc2 = next(e for e in second if e["kind"] == "accepted")
    assert acc2["slot"] == acc1["slot"]
    assert acc2["reused"] > 0


async def test_it_rejects_a_bad_request():
    events = await collect(GenerationRequest(prompt="hi", max_tokens=0))
    assert final(events)["code"] == "BAD_REQUEST"


async def test_it_runs_each_request_with_its_own_expert_count():
    from engine_bridge.telemetry import aget_state

    model = (await aget_state())["model"]
    assert model["experts_min"] == 1 and model["experts_max"] == model["n_experts"]
    prompt = CHATML.format("Count the experts")
    base, one, every = await asyncio.gather(
        collect(GenerationRequest(prompt=prompt, max_tokens=24)),
        collect(GenerationRequest(prompt=prompt, max_tokens=24, experts=1)),
        collect(GenerationRequest(prompt=prompt, max_tokens=24, experts=model["experts_max"])))
    assert final(base)["kind"] == final(one)["kind"] == final(every)["kind"] == "done"
    # the fixture model routes top-2 of 8: one expert or all eight give other greedy text
    assert text_of(one) != text_of(base) or text_of(every) != text_of(base)
    again = await collect(GenerationRequest(prompt=prompt, max_tokens=24, experts=1))
    assert text_of(again) == text_of(one)  # the count is honoured the same way each time


@pytest.mark.parametrize("experts", [0, 9, 10 ** 6])
async def test_it_refuses_an_expert_count_outside_the_models_range(experts):
    events = await collect(GenerationRequest(prompt=CHATML.format("hi"), max_tokens=4, experts=experts))
    err = final(events)
    assert err["code"] == "BAD_REQUEST" and "experts" in err["message"] and "[1, 8]" in err["message"], err


async def test_done_names_the_stop_string_that_ended_the_text():
    prompt = CHATML.format("Say anything at all")
    free = text_of(await collect(GenerationRequest(prompt=prompt, max_tokens=40)))
    assert len(free) > 12
    stop = free[6:10]  # greedy: the same text comes again, and this string ends it
    events = await collect(GenerationRequest(prompt=prompt, max_tokens=40, stop=["never appears", stop]))
    done = final(events)
    assert done["finish_reason"] == "stop" and done["stop_sequence"] == stop, done
    assert text_of(events) == free[:free.index(stop)]
    plain = final(await collect(GenerationRequest(prompt=prompt, max_tokens=5)))
    assert plain["stop_sequence"] is None
