"""When the bridge sends a request's events (engine_bridge/pacing.py): the first token at once,
later text at most once per text interval, and the interval grows with the number of running
requests so that all of them together stay within BRIDGE_TEXT_BATCHES_PER_S.

The async tests run on a virtual clock (tests/support/vclock.py, a test double for time): their
assertions are about which side of a frame deadline an event falls, and on the real clock a busy
host that preempts the test for a frame moved events across it.
"""
import asyncio

import pytest

from engine_bridge import pacing
from engine_bridge.jobs import Request
from engine_bridge.request import GenerationRequest
from tests.support.vclock import on_virtual_clock, patch_monotonic


@pytest.fixture
def bridge(settings, monkeypatch):
    settings.BRIDGE_TEXT_BATCHES_PER_S = 100
    settings.BRIDGE_TEXT_FRAME_S = 0.015
    b = pacing.Pacer(running={})
    patch_monotonic(monkeypatch, pacing)
    sent = []

    async def send(listener, messages):  # stands in for Redis: records when each batch left
        loop = asyncio.get_running_loop()
        sent.extend((loop.time(), message) for message in messages)

    monkeypatch.setattr(b, "_send", send)
    return b, sent


def running(b, n):
    requests = []
    for i in range(n):
        r = Request(f"r{i}", GenerationRequest(prompt="p", max_tokens=9), reply_to="listener")
        b.running[len(b.running) + 1] = r
        requests.append(r)
    return requests


def test_the_interval_is_a_frame_for_one_stream_and_a_budget_share_for_many(bridge):
    b, _ = bridge
    running(b, 1)
    assert b.text_interval() == b.text_frame_s
    running(b, 8)  # 9 running now
    assert b.text_interval() == pytest.approx(9 / 100)


@on_virtual_clock
async def test_the_first_token_leaves_at_once_and_later_text_coalesces(bridge):
    b, sent = bridge
    (r,) = running(b, 1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    b.emit(r, {"kind": "text", "text": "a"})
    await asyncio.sleep(0.001)
    assert len(sent) == 1 and sent[0][0] - t0 < 0.005          # the first token did not wait
    for piece in "bcd":
        b.emit(r, {"kind": "text", "text": piece})
    await asyncio.sleep(0.001)
    assert len(sent) == 1                                       # held: less than a frame since "a"
    await asyncio.sleep(b.text_frame_s + 0.01)
    assert [m["events"] for _, m in sent] == [[{"kind": "text", "text": "a"}], [{"kind": "text", "text": "bcd"}]]
    assert sent[1][0] - sent[0][0] >= b.text_frame_s - 0.002


@on_virtual_clock
async def test_a_final_event_never_waits_for_the_frame(bridge):
    b, sent = bridge
    (r,) = running(b, 1)
    b.emit(r, {"kind": "text", "text": "a"})
    await asyncio.sleep(0.001)
    b.emit(r, {"kind": "text", "text": "b"})
    b.emit(r, {"kind": "done", "finish_reason": "stop"})
    await asyncio.sleep(0.002)
    assert [e["kind"] for _, m in sent for e in m["events"]] == ["text", "text", "done"]


@on_virtual_clock
async def test_batches_of_several_requests_ready_together_share_one_send(bridge, monkeypatch):
    b, _ = bridge
    sends = []

    async def send(listener, messages):
        sends.append((listener, [m["req"] for m in messages]))
        await asyncio.sleep(0.001)

    monkeypatch.setattr(b, "_send", send)
    r1, r2, r3 = running(b, 3)
    b.emit(r1, {"kind": "text", "text": "a"})   # leaves at once, alone
    await asyncio.sleep(0)
    b.emit(r2, {"kind": "text", "text": "b"})   # both queue behind the send in flight...
    b.emit(r3, {"kind": "text", "text": "c"})
    await asyncio.sleep(0.01)
    assert sends == [("listener", ["r0"]), ("listener", ["r1", "r2"])]  # ...and leave together


def test_a_token_at_a_time_engine_is_read_at_most_every_pause_once_all_streams_started(bridge):
    b, _ = bridge
    slow = 0.005                                    # 5 ms since the previous read
    assert b.read_pause(1, slow) == 0.0             # nothing running
    r1, r2 = running(b, 2)
    r1.t_first = 1.0
    assert b.read_pause(2, slow) == 0.0             # r2 waits for its first token
    r2.t_first = 2.0
    assert b.read_pause(2, slow) == min(b.text_frame_s, pacing.READ_PAUSE_S)  # a token per stream per read: wait
    assert b.read_pause(40, slow) == 0.0            # output in bursts: read on
    assert b.read_pause(2, 0.0001) == 0.0           # the data was already there (a fast engine): read on
    assert b.read_pause(10, 0.025) > 0              # 10 tokens over a 20 ms pause + 5 ms: still slow, pause again
    r1.cancelled = True
    assert b.read_pause(2, slow) == 0.0             # r1's CANCELLED is due: read it at once
    r1.cancelled = False
    r1.stopped = True
    assert b.read_pause(2, slow) == 0.0             # so is the DONE of a stopped request
    r1.stopped = False
    r2.tokens = r2.job.max_tokens - 1
    assert b.read_pause(2, slow) == 0.0             # r2's next event is its DONE: read it at once


@on_virtual_clock
async def test_held_text_of_several_streams_leaves_together(bridge, monkeypatch):
    b, _ = bridge
    sends = []

    async def send(listener, messages):
        sends.append((asyncio.get_running_loop().time(), sorted(m["req"] for m in messages)))

    monkeypatch.setattr(b, "_send", send)
    streams = running(b, 3)
    for r in streams:
        b.emit(r, {"kind": "text", "text": "a"})
    await asyncio.sleep(0.001)
    interval = b.text_interval()
    first = asyncio.get_running_loop().time()
    for i, r in enumerate(streams):        # their first batches left 4 ms apart: due 4 ms apart
        r.text_sent_at = first + 0.004 * i
        b.emit(r, {"kind": "text", "text": "b"})
    assert len(sends) == 1                 # all three held
    await asyncio.sleep(3 * interval + 0.02)
    assert [reqs for _, reqs in sends[1:]] == [["r0", "r1", "r2"]]  # one send for the three
    assert sends[1][0] >= first + interval - 0.001                  # not before the first was due


@on_virtual_clock
async def test_events_read_with_the_first_token_join_its_batch_before_it_leaves(bridge):
    b, sent = bridge
    r1, r2 = running(b, 2)
    # One engine read holds r1's first DATA and its DONE (max_tokens reached), and r2's first DATA.
    b.emit(r1, {"kind": "text", "text": "a"})
    b.emit(r2, {"kind": "text", "text": "x"})
    b.emit(r1, {"kind": "text", "text": "b"})
    b.emit(r1, {"kind": "done", "finish_reason": "length"})
    await asyncio.sleep(0.005)
    batches = [(m["req"], m["seq"], [e["kind"] for e in m["events"]]) for _, m in sent]
    assert batches == [("r0", 0, ["text", "text", "done"]), ("r1", 0, ["text"])]  # one batch each, no seq 1
    assert not r1.sending and r1.waiting is None


@on_virtual_clock
async def test_events_after_a_batch_left_for_redis_wait_for_the_next_batch(bridge, monkeypatch):
    b, _ = bridge
    sends, release = [], asyncio.Event()

    async def send(listener, messages):  # Redis slow to answer: the batch is on its way
        sends.append([(m["seq"], [e["kind"] for e in m["events"]]) for m in messages])
        await release.wait()

    monkeypatch.setattr(b, "_send", send)
    (r,) = running(b, 1)
    b.emit(r, {"kind": "text", "text": "a"})
    await asyncio.sleep(0.001)                 # the sender took the batch
    b.emit(r, {"kind": "done", "finish_reason": "stop"})
    assert sends == [[(0, ["text"])]]          # the batch on its way was not changed after it left
    release.set()
    await asyncio.sleep(0.005)
    assert sends == [[(0, ["text"])], [(1, ["done"])]]
