"""Issue 10, failure containment, with the real bridge worker and the real engine: an engine that
cannot start is answered at once; a killed bridge ends its clients' streams with an error event;
a Redis outage under a live stream costs neither the bridge nor the engine; a bad value cannot
restart the engine under another user's stream."""
import asyncio
import contextlib
import os
import signal
import subprocess
import time


from engine_bridge import liveness
from engine_bridge import transport
from engine_bridge.client import generate
from engine_bridge.request import GenerationRequest
from engine_bridge.telemetry import aget_state
from tests.bridge.conftest import bridge_env
from tests.bridge.helpers import CHATML, collect, final, text_of
from tests.support import procs

LONG = 100_000  # tokens: the fixture model decodes thousands a second; this outlasts each test step


def _start_bridge_no_wait(env):
    """run_bridge without waiting for the engine (it may never come up)."""
    return subprocess.Popen([procs.PYTHON, str(procs.ROOT / "manage.py"), "run_bridge"], cwd=procs.ROOT,
                            env={**os.environ, **env})


async def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _first_text(agen):
    async for event in agen:
        if event["kind"] == "text":
            return event
        assert event["kind"] not in ("done", "error"), event
    raise AssertionError("stream ended before any text")


async def test_an_engine_that_cannot_start_is_answered_at_once(redis_url, engine_binary, tmp_path):
    proc = _start_bridge_no_wait(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                            ENGINE_MODEL=str(tmp_path / "missing.gguf")))
    try:
        await _wait_for(lambda: _has_boot(), 30, "the bridge's heartbeat")
        for _ in range(3):  # also after several failed starts: backoff is capped low
            t0 = time.monotonic()
            events = await collect(GenerationRequest(prompt="hello", max_tokens=4), timeout=60, idle_timeout=60)
            elapsed = time.monotonic() - t0
            err = final(events)
            # the bridge's own refusal (retry_after: the client's idle rule carries none), not a wait
            # for an engine that will not come: well before the client would give up (the bound
            # leaves a loaded host its scheduling delays; 3 s failed under a CPU hog)
            assert err["kind"] == "error" and err["code"] == "ENGINE_UNAVAILABLE", err
            assert 1 <= err["retry_after"] <= 10, err
            assert elapsed < 15, f"answered after {elapsed:.1f}s"
            await asyncio.sleep(1.5)
        state = await aget_state()
        assert state["status"] in ("down", "starting") and state["restarts"] >= 2
    finally:
        procs.stop(proc)


async def _has_boot():
    return bool(await liveness.aget_boot())


async def test_a_killed_bridge_ends_its_streams_with_an_error(redis_url, engine_binary, tiny_model):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="131072"))
    try:
        streams = [generate(GenerationRequest(prompt=CHATML.format(f"story {i}"), max_tokens=LONG)) for i in range(2)]
        for agen in streams:
            await _first_text(agen)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        for agen in streams:
            async with contextlib.aclosing(agen):
                events = [e async for e in agen]
            err = final(events)
            assert err["kind"] == "error" and err["code"] == "ENGINE_UNAVAILABLE", err
            assert "bridge stopped" in err["message"]
        assert time.monotonic() - t0 < 8, "clients noticed the dead bridge too late"
    finally:
        procs.stop(proc)


async def test_a_redis_outage_costs_neither_the_bridge_nor_the_engine(private_redis, engine_binary, tiny_model):
    proc = procs.start_bridge(bridge_env(private_redis.url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="131072"))
    try:
        agen = generate(GenerationRequest(prompt=CHATML.format("a long story"), max_tokens=LONG))
        await _first_text(agen)
        private_redis.stop()
        await asyncio.sleep(3)
        private_redis.start()
        # The stream in flight ends in bounded time, cleanly: done, or an error event (its reply
        # channel lived in the Redis that was lost), never a hang.
        async with contextlib.aclosing(agen):
            events = await asyncio.wait_for(_drain(agen), 60)
        assert events and events[-1]["kind"] in ("done", "error"), events[-1:]
        assert proc.poll() is None, "the bridge exited on a Redis outage"
        await _wait_for(_has_boot, 10, "the bridge's heartbeat after the outage")
        await _wait_for(_up, 10, "the telemetry after the outage")
        state = await aget_state()
        assert state["restarts"] == 0, "the engine was restarted by a Redis outage"
        events = await collect(GenerationRequest(prompt=CHATML.format("hello again"), max_tokens=8), timeout=30)
        assert final(events)["kind"] == "done" and text_of(events)
    finally:
        procs.stop(proc)


async def _drain(agen):
    return [event async for event in agen]


async def _up():
    return (await aget_state())["up"]


async def test_a_subnormal_temperature_does_not_restart_the_engine_under_another_stream(redis_url, engine_binary, tiny_model):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="131072"))
    try:
        other = generate(GenerationRequest(prompt=CHATML.format("a long story"), max_tokens=4000))
        await _first_text(other)
        # Straight onto the bridge channel, as any surface's bug could send it: the bridge itself
        # must put it on the wire in a form the engine takes.
        for temperature, top_p in ((1e-320, 1.0), (2e-308, 1e-320), (0.5, 5e-324)):
            events = await collect(GenerationRequest(prompt=CHATML.format("hi"), max_tokens=4,
                                                     temperature=temperature, top_p=top_p), timeout=30)
            assert final(events)["kind"] == "done", final(events)
        boot = await liveness.aget_boot()
        await transport.to_bridge({"type": "gen.submit", "req": "nan1", "boot": boot,
                                   "job": {"prompt": "hi", "max_tokens": 4, "temperature": float("nan")}})
        message = (await asyncio.wait_for(transport.replies("nan1"), 10))[0]
        assert message["events"][0]["code"] == "BAD_REQUEST" and "temperature" in message["events"][0]["message"]
        # A job that is no object is refused the same way (it was an AttributeError in the bridge).
        await transport.to_bridge({"type": "gen.submit", "req": "list1", "boot": boot, "job": ["hi"]})
        message = (await asyncio.wait_for(transport.replies("list1"), 10))[0]
        refusal = message["events"][0]
        assert refusal["code"] == "BAD_REQUEST" and "job must be an object" in refusal["message"]
        async with contextlib.aclosing(other):
            rest = [e async for e in other]
        assert final(rest)["kind"] == "done", final(rest)
        assert (await aget_state())["restarts"] == 0
    finally:
        procs.stop(proc)


async def test_a_lone_surrogate_is_refused_before_it_reaches_redis(redis_url, engine_binary, tiny_model):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary), ENGINE_MODEL=str(tiny_model)))
    try:
        before = procs.blocked_clients(redis_url)
        for stop in ([], ["\udc80"]):
            events = await collect(GenerationRequest(prompt="hi \ud800" if not stop else "hi", max_tokens=4, stop=stop),
                                   timeout=5)
            assert final(events)["code"] == "BAD_REQUEST" and "surrogate" in final(events)["message"]
        await asyncio.sleep(0.2)
        # only the bridge's own receive may be blocked: no receiver left waiting per refused request
        assert procs.blocked_clients(redis_url) <= max(before, 1)
    finally:
        procs.stop(proc)
