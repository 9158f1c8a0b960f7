"""The engine's serve loop prefers prefill to decode (native/src/server_wire.c wire_read_commands): SUBMITs
that arrive while a prefill runs are prefilled before the next decode step, so a burst of clients
admitted one after another by a web front end gets its first tokens as if it had come in one
write, instead of each waiting behind decode steps of the ones before (issue 14)."""
import time

from tests.native.engine import ASAN, T, chatml

# A prefill long enough that the late SUBMITs surely arrive while it runs, sized to the build:
# ~3,600 tokens took 68-81 s under ASan on 2 slow cores (against an 80 s wait); a quarter of it
# still runs for seconds there, while the late writes take milliseconds.
LONG_REPEATS = 300 if ASAN else 1200


def test_submits_that_arrive_during_a_prefill_are_prefilled_before_the_next_decode_step(spawn):
    e = spawn(slots=4, ctx=4096)
    long_prompt = chatml("tell me " * LONG_REPEATS)  # a prefill of ~900 (ASan) or ~3,600 tokens
    first = e.submit(long_prompt, slot=0, max_tokens=4)
    e.wait(lambda: e.reqs[first].accept is not None, T, "ACCEPT of the long prompt")
    started = time.monotonic()
    late = [e.submit(chatml(f"hi {i}"), slot=i + 1, max_tokens=4) for i in range(3)]  # separate writes
    for rid in [first, *late]:
        e.result(rid, timeout=3 * T)
    second_token_of_first = [i for i, (kind, parts, _) in enumerate(e.events)
                             if kind == "DATA" and int(parts[1]) == first][1]
    took = time.monotonic() - started
    accepts = [e.reqs[rid].first_event for rid in late]
    assert all(a < second_token_of_first for a in accepts), (accepts, second_token_of_first, took)
