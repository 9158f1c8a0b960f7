"""The bridge worker against test-double engines (tests/bridge/fake_engines/): crashes, banners,
unknown line kinds, queueing."""
import asyncio
import contextlib
import time


from engine_bridge.client import generate
from engine_bridge.request import GenerationRequest
from engine_bridge.telemetry import aget_state
from tests.bridge.conftest import bridge_env, fake_command
from tests.bridge.helpers import Stream, collect, final, text_of, until
from tests.support import procs


@contextlib.contextmanager
def bridge(redis_url, engine, **env):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_COMMAND=fake_command(engine), **env))
    try:
        yield proc
    finally:
        procs.stop(proc)


async def test_it_restarts_an_engine_that_dies_mid_line(redis_url, tmp_path):
    with bridge(redis_url, "crash_mid_line.py", FAKE_STATE_DIR=str(tmp_path), FAKE_DELAY="0.01"):
        events = await collect(GenerationRequest(prompt="hello", max_tokens=50))
        err = final(events)
        assert err["code"] == "ENGINE_DIED"
        assert err["message"].startswith("The engine stopped unexpectedly")
        assert text_of(events) == "héllo"  # 3 frames of 2 bytes arrived before the crash
        deadline = time.monotonic() + 10
        while not ((state := await aget_state())["up"] and state["restarts"] == 1):
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.1)
        events = await collect(GenerationRequest(prompt="hello", max_tokens=6))
        assert final(events)["kind"] == "done"
        assert text_of(events) == "héllo wörl"


async def test_it_skips_banners_and_ignores_unknown_kinds(redis_url):
    with bridge(redis_url, "mux_fake.py", FAKE_BANNER="1", FAKE_UNKNOWN="1"):
        events = await collect(GenerationRequest(prompt="hello", max_tokens=9))
        done = final(events)
        assert done["kind"] == "done" and done["usage"] == {"prompt_tokens": 5, "completion_tokens": 9}
        assert text_of(events) == "héllo wörld 🙂"   # the emoji arrived split over two frames
        cut = await collect(GenerationRequest(prompt="hello", max_tokens=8))
        assert text_of(cut) == "héllo wörld \ufffd"  # half an emoji at DONE: flushed as U+FFFD
        assert done["perf"]["forwards"] == 7
        state = await aget_state()
        assert state["model"]["name"] == "fake-moe" and state["restarts"] == 0
        assert state["hwinfo"]["cpu"] == "Fake CPU @ 1.00GHz"


async def test_it_queues_with_positions_and_rejects_when_full(redis_url):
    with bridge(redis_url, "mux_fake.py", KV_SLOTS="1", BRIDGE_QUEUE_LIMIT="2", FAKE_DELAY="0.02"):
        # each step waits for the bridge to have taken the one before: the slot, then the queue
        running = Stream(GenerationRequest(prompt="a", max_tokens=100))
        await running.seen("text")
        bg = Stream(GenerationRequest(prompt="b", max_tokens=2, priority="background"))
        await bg.seen("queued")
        fg = Stream(GenerationRequest(prompt="c", max_tokens=2))
        await fg.seen("queued")
        rejected = await collect(GenerationRequest(prompt="d", max_tokens=2))
        assert final(rejected)["code"] == "QUEUE_FULL" and final(rejected)["retry_after"] >= 1
        assert not running.task.done(), "the running request ended before the queue was full"
        results = [await s.result() for s in (running, bg, fg)]
        assert all(final(r)["kind"] == "done" for r in results)
        bg_positions = [e["position"] for e in results[1] if e["kind"] == "queued"]
        fg_positions = [e["position"] for e in results[2] if e["kind"] == "queued"]
        assert bg_positions == [1, 2, 1]   # the interactive job overtook it
        assert fg_positions == [1]


async def test_it_cancels_a_queued_job_when_the_caller_leaves(redis_url):
    with bridge(redis_url, "mux_fake.py", KV_SLOTS="1", FAKE_DELAY="0.02"):
        running = Stream(GenerationRequest(prompt="a", max_tokens=100))
        await running.seen("text")
        async with contextlib.aclosing(generate(GenerationRequest(prompt="b", max_tokens=2))) as events:
            async for event in events:
                if event["kind"] == "queued":
                    break                 # the caller leaves while its job waits
        assert final(await running.result())["kind"] == "done"
        # telemetry writes are throttled: the state shows the cancelled job gone within a while
        await until(_idle, 10, "an idle bridge (nothing queued, no slot busy)")


async def _idle() -> bool:
    state = await aget_state()
    return state["queue"] == 0 and state["busy"] == 0


async def test_it_says_unavailable_when_no_bridge_runs(redis_url):
    events = await collect(GenerationRequest(prompt="x", max_tokens=2), idle_timeout=5)
    assert final(events)["code"] == "ENGINE_UNAVAILABLE"


async def test_it_drains_in_flight_requests_on_shutdown(redis_url):
    with bridge(redis_url, "mux_fake.py", FAKE_DELAY="0.02") as proc:
        events = []
        async with contextlib.aclosing(generate(GenerationRequest(prompt="a", max_tokens=30))) as stream:
            async for event in stream:
                events.append(event)
                if event["kind"] == "text" and proc.poll() is None:
                    proc.terminate()   # closes the engine's stdin: the request still finishes
        done = final(events)
        assert done["kind"] == "done" and done["usage"]["completion_tokens"] == 30
        assert proc.wait(10) == 0
        assert (await aget_state())["updated"] is None


async def test_an_engine_without_a_model_line_is_described_by_what_it_was_started_with(redis_url):
    with bridge(redis_url, "mux_fake.py", FAKE_NO_MODEL="1", ENGINE_MODEL="/srv/models/GLM-4.6-colibri"):
        state = await aget_state()
        assert state["model"] == {"name": "GLM-4.6-colibri", "file": "/srv/models/GLM-4.6-colibri", "ctx": 256,
                                  "slots": 2, "extensions": False}
        for field in ({"seed": 7}, {"experts": 4}, {"routes": True}, {"heat": False}):
            events = await collect(GenerationRequest(prompt="hello", max_tokens=3, **field))
            err = final(events)
            assert err["code"] == "BAD_REQUEST" and f"{next(iter(field))} is not supported" in err["message"], err
        assert final(await collect(GenerationRequest(prompt="hello", max_tokens=3)))["kind"] == "done"


async def test_a_grammar_is_refused_for_an_engine_that_does_not_announce_it(redis_url):
    """The real colibri binary takes gbytes for drafts only and would reject grammar=1: the
    bridge answers a clean error instead of sending it there (or sending it unconstrained)."""
    from engine_bridge.grammar import grammar_for_json_object

    for env in ({"FAKE_NO_MODEL": "1"}, {}):  # colibri-like; a MODEL line without "grammar"
        with bridge(redis_url, "mux_fake.py", **env):
            err = final(await collect(GenerationRequest(prompt="hello", max_tokens=3,
                                                        grammar=grammar_for_json_object())))
            assert err["code"] == "BAD_REQUEST", err
            assert "constrained decoding is not supported by this engine" in err["message"], err


async def test_a_long_silent_prefill_is_neither_hung_nor_idle(redis_url):
    """A long prompt's prefill under a small memory budget: the engine computes for longer than a
    client waits on a silent bridge (idle_timeout) without a line on stdout and without reading
    its commands. It works (CPU time grows), so the bridge does not call it hung and keeps the
    stream alive; the request ends with its text."""
    with bridge(redis_url, "mux_fake.py", FAKE_BUSY_PREFILL="14"):
        stream = Stream(GenerationRequest(prompt="a long prompt", max_tokens=3), idle_timeout=12)
        await stream.seen("accepted")
        hung_seen = []
        while not stream.task.done():
            hung_seen.append((await aget_state())["hung"])
            await asyncio.sleep(0.5)
        events = await stream.result()
        assert final(events)["kind"] == "done", final(events)
        assert text_of(events) == "héllo"
        assert len(hung_seen) > 20 and not any(hung_seen), hung_seen
        assert not [e for e in events if e is not None and e["kind"] == "alive"]  # the client's own
