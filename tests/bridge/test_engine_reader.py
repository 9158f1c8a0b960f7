"""The engine reader (engine_bridge.engine.Engine): during its owner's read pause the engine's
lines wait in the pipe, so the bridge is not woken once per line (issue 14: each wakeup preempts
an engine thread on a small host), and a command written meanwhile ends the pause at once.

Engine: fake_engines/mux_fake.py, a test double that writes one line per write, a token every
FAKE_DELAY seconds, like a real engine decoding one stream.
"""
import asyncio
import os
import signal
import sys
import time

from engine_bridge import protocol
from engine_bridge.engine import Engine, ProcSample
from engine_bridge.request import GenerationRequest
from tests.bridge.conftest import FAKES


def voluntary_switches():
    """This thread's voluntary context switches: one per wait of the event loop that slept."""
    for line in open("/proc/thread-self/status"):
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


class Recorder:
    def __init__(self):
        self.events, self.arrived = [], []
        self.changed = asyncio.Event()

    def __call__(self, event):
        self.events.append(event)
        self.arrived.append(time.monotonic())
        self.changed.set()

    async def until(self, test, timeout):
        async with asyncio.timeout(timeout):
            while not any(test(event) for event in self.events):
                self.changed.clear()
                await self.changed.wait()

    def count(self, kind):
        return sum(isinstance(event, kind) for event in self.events)


async def start_fake(recorder, read_pause, delay):
    env = {**os.environ, "KV_SLOTS": "1", "CTX": "4096", "FAKE_DELAY": str(delay)}
    engine = Engine([sys.executable, str(FAKES / "mux_fake.py")], env, recorder, slots=1, read_pause=read_pause)
    await engine.start(ready_timeout=20)
    return engine


async def test_it_takes_the_lines_written_during_a_pause_in_one_read_without_waking_for_each():
    recorder = Recorder()
    pause = {"s": 0.0}
    engine = await start_fake(recorder, lambda events, cycle: pause["s"], delay=0.005)
    try:
        # longer than the whole answer (80 lines, one every ~5 ms: 0.4 s), with room for a loaded
        # host, where the fake engine's sleeps ran long and 0.6 s ended before its last lines
        pause["s"] = 2.0
        await engine.submit(1, 0, GenerationRequest(prompt="hello", max_tokens=80))
        await recorder.until(lambda e: isinstance(e, protocol.Accept), timeout=5)
        switches = voluntary_switches()
        await recorder.until(lambda e: isinstance(e, protocol.Done), timeout=10)
        woken = voluntary_switches() - switches
        assert recorder.count(protocol.Data) == 80
        # A reader that watched the pipe all the time woke ~80 times (a line per write); this one
        # sleeps through the pause and wakes for its end and the read after it.
        assert woken < 15, f"the event loop woke {woken} times while 80 lines arrived"
        # The pause held them: written one every ~5 ms, most were handed over together, in one
        # read at the pause's end (whether the first lines rode with ACCEPT's read is timing).
        data_arrived = [t for t, e in zip(recorder.arrived, recorder.events) if isinstance(e, protocol.Data)]
        together = sum(1 for t in data_arrived if data_arrived[-1] - t < 0.005)
        assert together >= 60, f"only {together} of 80 lines arrived with the last one"
    finally:
        await engine.kill()


async def test_it_ends_a_read_pause_when_a_command_is_written():
    recorder = Recorder()
    pause = {"s": 0.0}
    # the owner's rule (pacing.Pacer.read_pause): no pause while a cancelled request's answer is due
    engine = await start_fake(recorder, lambda events, cycle: pause["s"], delay=0.002)
    try:
        await engine.submit(1, 0, GenerationRequest(prompt="hello", max_tokens=100000))
        # the pause starts once ACCEPT is in: set before, an ACCEPT written just after the submit's
        # read ended waited the whole 30 s pause (failed once on a loaded 2-core host)
        await recorder.until(lambda e: isinstance(e, protocol.Accept), timeout=20)
        pause["s"] = 30.0
        await asyncio.sleep(0.3)
        seen = len(recorder.events)
        await asyncio.sleep(0.3)
        assert len(recorder.events) == seen  # paused: the tokens written meanwhile wait in the pipe
        written = time.monotonic()
        pause["s"] = 0.0
        await engine.cancel(1)
        await recorder.until(lambda e: isinstance(e, protocol.Error) and e.code == "CANCELLED", timeout=5)
        assert time.monotonic() - written < 2.0  # not the 30 s pause
        assert recorder.count(protocol.Data) > 100  # what waited in the pipe came with it
    finally:
        await engine.kill()


async def test_a_command_sent_is_in_the_pipe_before_send_returns():
    """Engine.send writes at once (the bridge admits a burst in one go: the first SUBMIT must
    reach the engine, which starts its prefill, before the others are admitted), in order."""
    recorder = Recorder()
    engine = await start_fake(recorder, lambda events, cycle: 0.0, delay=0.001)
    try:
        engine.send(engine.submit_command(1, 0, GenerationRequest(prompt="first", max_tokens=2)))
        assert engine.proc.stdin.transport.get_write_buffer_size() == 0  # nothing waits for the loop
        engine.send(protocol.format_stop(1))
        await recorder.until(lambda e: isinstance(e, protocol.Done) and e.id == 1, timeout=5)
        assert [type(e) for e in recorder.events if getattr(e, "id", None) == 1][0] is protocol.Accept
    finally:
        await engine.kill()


async def test_one_sample_of_proc_tells_the_work_figure_and_a_stopped_engine():
    """Engine.sample (the watchdog's one /proc read a tick): a running engine has a work figure
    and is not stopped; SIGSTOP shows at once, SIGCONT clears it; before a start it tells nothing."""
    recorder = Recorder()
    assert Engine(["true"], {}, recorder, slots=1).sample() == ProcSample(None, False)
    engine = await start_fake(recorder, lambda events, cycle: 0.0, delay=0.001)
    try:
        # the child's first CPU tick may not have come yet on a loaded host: wait for it, not a delay
        async with asyncio.timeout(10):
            while not engine.sample().work:
                await asyncio.sleep(0.01)
        running = engine.sample()
        assert isinstance(running.work, int) and running.work > 0 and not running.stopped
        os.kill(engine.pid, signal.SIGSTOP)
        try:
            async with asyncio.timeout(5):  # the kernel marks the stop as the signal is taken
                while not engine.sample().stopped:
                    await asyncio.sleep(0.01)
            assert engine.sample().work is not None
        finally:
            os.kill(engine.pid, signal.SIGCONT)
        async with asyncio.timeout(5):
            while engine.sample().stopped:
                await asyncio.sleep(0.01)
    finally:
        await engine.kill()
