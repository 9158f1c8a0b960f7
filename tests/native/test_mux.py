"""Mux protocol behaviour of the native engine, mostly on one shared engine process
(16 KV slots, CTX 512, the default tiny MoE fixture: 4 MoE layers x 8 experts, top-2).
Each test uses its own slots, so the tests stay independent of each other's KV state."""
from __future__ import annotations

import math
import time

import pytest

from tests.native.engine import (SCALE, T, chatml, hits_bits, new_id, parse_hwinfo, parse_map,
                                 parse_tiers)

pytestmark = pytest.mark.timeout(int(120 * SCALE))

ROWS, COLS, TOP_K = 4, 8, 2
CTX = 512


def tier_counts(emap: bytes):
    c = [0, 0, 0, 0]
    for b in emap:
        c[b >> 6] += 1
    return c


def check_block(r, rows=ROWS, cols=COLS):
    """The per-turn telemetry block before DONE: HWINFO, PERF <id>, ENTROPY, GPUS, TIERS, EMAP,
    HITS (order not asserted: a bridge must not depend on it)."""
    kinds = [ln.split(" ", 1)[0] for ln in r.block]
    for k in ("HWINFO", "TIERS", "EMAP", "HITS", "ENTROPY", "GPUS"):
        assert k in kinds, f"request {r.id}: no {k} in the telemetry block {kinds}"
    parse_hwinfo(r.block_line("HWINFO"))
    vram, ram, disk, _, _ = parse_tiers(r.block_line("TIERS"))
    er, ec, emap = parse_map(r.block_line("EMAP"), "EMAP")
    assert (er, ec, len(emap)) == (rows, cols, rows * cols)
    c = tier_counts(emap)
    assert c[3] == 0, f"tier 3 in EMAP: {r.block_line('EMAP')}"
    assert (c[2], c[1], c[0]) == (vram, ram, disk), f"TIERS {r.block_line('TIERS')} vs EMAP tiers {c}"
    hr, hc, hits = parse_map(r.block_line("HITS"), "HITS")
    assert (hr, hc, len(hits)) == (rows, cols, math.ceil(rows * cols / 8))
    ent = r.block_line("ENTROPY").split(" ")[1:]
    assert len(ent) == rows, f"ENTROPY should have one value per MoE layer: {r.block_line('ENTROPY')}"
    for h in map(float, ent):
        assert 0.0 <= h <= math.log2(cols) + 1e-3, f"entropy {h} out of [0, log2 {cols}]"
    assert r.block_line("GPUS").split(" ")[1] == "0", r.block_line("GPUS")
    assert r.perf is not None, f"no PERF {r.id} line"
    assert len(r.perf) == 7, f"PERF {r.id} {' '.join(r.perf)}: expected 7 fields after the id"
    for v in r.perf:
        assert math.isfinite(float(v))
    prof = r.block_line("PROF")
    if prof is not None:
        assert len(prof.split(" ")) in (10, 17, 18), f"bad PROF {prof!r}"


def check_done(r, max_tokens, ctx=CTX):
    s = r.stat()
    max_tokens = min(max_tokens, ctx - r.prompt_tokens - 1)   # the engine clamps to the room left
    assert s["emitted"] == len(r.data), f"DONE says {s['emitted']} tokens, saw {len(r.data)} DATA frames"
    assert s["prompt_tokens"] == r.prompt_tokens, f"DONE prompt_tokens {s['prompt_tokens']} != ACCEPT {r.prompt_tokens}"
    assert s["emitted"] <= max_tokens
    assert s["length_limited"] in (0, 1)
    if s["length_limited"]:
        assert s["emitted"] == max_tokens
    assert s["tok_s"] >= 0 and 0 <= s["hit_pct"] <= 100 and s["rss_gb"] >= 0
    return s


# ---------------------------------------------------------------------------------------------


def test_it_round_trip(eng):
    rid = eng.submit(chatml("Hello there, how are you?"), slot=0, max_tokens=12)
    r = eng.result(rid)
    assert r.errors == [], r.errors
    assert r.accept is not None and len(r.accept) >= 1
    assert r.prompt_tokens > 5
    for f in r.accept[1:]:
        assert "=" in f, f"ACCEPT extra field {f!r} is not key=value"
    ev = eng.events
    kinds = [ev[i][0] for i in range(r.first_event, r.last_event + 1) if len(ev[i][1]) > 1 and ev[i][1][1] == str(rid)]
    assert kinds[0] == "ACCEPT" and kinds[-1] == "DONE", kinds
    assert set(kinds[1:-1]) <= {"DATA", "PERF", "TOPK", "IOSTAT"}, kinds
    s = check_done(r, 12)
    assert s["emitted"] >= 1 or s["length_limited"] == 0
    check_block(r)


def test_it_prefix_reuse(eng):
    p1 = chatml("What is the capital of France?").encode()
    r1 = eng.generate(p1, slot=3, max_tokens=8)
    p2 = p1 + r1.text + b"<|im_end|>\n<|im_start|>user\nAnd the capital of Spain?<|im_end|>\n<|im_start|>assistant\n"
    r2 = eng.generate(p2, slot=3, max_tokens=8)
    reused = r2.reused
    how = "ACCEPT reused="
    if reused is None:
        import re
        m = re.findall(r"prefix (\d+)/(\d+)", eng.stderr_text())
        assert m, f"ACCEPT {r2.id} {' '.join(r2.accept)} has no reused= and stderr has no '[API] ... prefix k/n' line"
        reused, how = int(m[-1][0]), "stderr prefix k/n"
    assert reused >= r1.prompt_tokens - 1, (
        f"second turn reused only {reused} tokens ({how}); first turn had {r1.prompt_tokens} prompt tokens")
    assert reused < r2.prompt_tokens
    # The same prompt on a slot with unrelated history must give the same greedy text.
    r3 = eng.generate(p2, slot=5, max_tokens=8)
    assert r3.text == r2.text, "greedy output differs between a reused prefix and a fresh prefill"
    # Identical prompt again on slot 3: (almost) everything reused, same text.
    r4 = eng.generate(p2, slot=3, max_tokens=8)
    if r4.reused is not None:
        assert r4.reused >= r2.prompt_tokens - 1
    assert r4.text == r2.text, "identical prompt on the same slot produced different greedy text"


def test_it_greedy_determinism(eng, spawn):
    p = chatml("Tell me a story about a fox and a dog.")
    a = eng.generate(p, slot=6, max_tokens=24)
    # A second process.
    e2 = spawn(slots=2)
    b = e2.generate(p, slot=1, max_tokens=24)
    assert b.text == a.text, f"greedy text differs across processes: {a.text!r} vs {b.text!r}"
    assert b.prompt_tokens == a.prompt_tokens
    assert e2.close() == 0
    # Beside a concurrently decoding (sampled) slot.
    long_id = eng.submit(chatml("Ramble on about anything at all."), slot=7, max_tokens=300, temperature=1.0, top_p=0.95)
    lr = eng.reqs[long_id]
    eng.wait(lambda: len(lr.data) >= 2 or lr.finished, what="first DATA of the background request")
    c = eng.generate(p, slot=8, max_tokens=24)
    concurrent = not lr.finished or lr.last_event > c.first_event
    if not lr.finished:
        eng.stop(long_id)
        eng.result(long_id)
    assert c.text == a.text, (f"greedy text changes when batched with another slot "
                              f"(background still decoding: {concurrent}): {a.text!r} vs {c.text!r}")


WORDS = ["apples", "rivers", "engines", "music", "stars", "bread", "code", "winter",
         "trains", "books", "oceans", "chess", "gardens", "clocks", "birds", "paper"]


def test_it_sixteen_slots(eng):
    prompts = [chatml(f"Question {i}: tell me something about {w}.") for i, w in enumerate(WORDS)]
    solo = [eng.generate(p, slot=i, max_tokens=12) for i, p in enumerate(prompts)]
    frames, ids = b"", []
    for i, p in enumerate(prompts):
        rid, fr = eng.submit(p, slot=(i + 5) % 16, max_tokens=12, write=False)
        frames += fr
        ids.append(rid)
    n0 = len(eng.events)
    eng.write(frames)
    eng.wait(lambda: all(eng.reqs[i].finished for i in ids), T * 2, "all 16 concurrent requests")
    bad = []
    for i, rid in enumerate(ids):
        r = eng.reqs[rid]
        if r.done is None:
            bad.append(f"slot {(i + 5) % 16}: {r.errors}")
        elif r.text != solo[i].text:
            bad.append(f"prompt {i}: concurrent {r.text!r} != solo {solo[i].text!r}")
        else:
            check_done(r, 12)
    assert not bad, "\n".join(bad)
    seq = [int(p[1]) for k, p, _ in eng.events[n0:] if k == "DATA"]
    switches = sum(1 for x, y in zip(seq, seq[1:]) if x != y)
    if sum(len(eng.reqs[i].data) >= 3 for i in ids) >= 8:
        assert switches > 32, f"DATA frames of the 16 requests are not interleaved (only {switches} id switches)"


LONG_CTX = 16384  # the fixture decodes ~10k tok/s: a long request must outlast the test's steps


def _long_request(eng, slot, prompts):
    """Starts a long greedy request that is still decoding after 2 DATA frames."""
    for p in prompts:
        rid = eng.submit(chatml(p), slot=slot, max_tokens=LONG_CTX - 64, temperature=0)
        r = eng.reqs[rid]
        eng.wait(lambda: len(r.data) >= 2 or r.finished, what=f"DATA of {rid}")
        if not r.finished:
            return rid, r
    pytest.fail("every long greedy request ended by itself before it could be interrupted")


LONG = ["Write a very long essay about the sea.", "List every number you know.", "Keep talking."]


def test_it_cancel_then_slot_reusable(spawn):
    eng = spawn(model="endless", slots=2, ctx=LONG_CTX)
    rid, r = _long_request(eng, 1, LONG)
    eng.cancel(rid)
    eng.wait(lambda: r.errors or r.done is not None, what=f"CANCELLED for {rid}")
    assert r.done is None, f"CANCEL {rid} produced DONE {r.done} (race: request ended first?)"
    assert r.codes == ["CANCELLED"], r.errors
    n_data = len(r.data)
    eng.sync()
    assert len(r.data) == n_data and r.done is None, "DATA/DONE after ERROR CANCELLED"
    eng.cancel(rid)
    eng.wait(lambda: len(r.errors) >= 2, what="NOT_FOUND for a second CANCEL")
    assert r.codes[-1] == "NOT_FOUND"
    r2 = eng.generate(chatml("Now something short."), slot=1, max_tokens=6)
    check_done(r2, 6)


def test_it_stop_gives_done(spawn):
    eng = spawn(model="endless", slots=2, ctx=LONG_CTX)
    rid, r = _long_request(eng, 1, LONG)
    eng.stop(rid)
    eng.result(rid)
    assert r.errors == [], r.errors
    s = check_done(r, LONG_CTX - 64, ctx=LONG_CTX)
    assert s["length_limited"] == 0, f"STOP must end with length_limited 0: DONE {' '.join(r.done)}"
    assert s["emitted"] < LONG_CTX - 64
    check_block(r)
    eng.stop(rid)
    eng.wait(lambda: r.errors, what="NOT_FOUND for a second STOP")
    assert r.codes == ["NOT_FOUND"]


def test_a_long_decode_sends_the_expert_tiers_and_heat_while_it_runs(spawn):
    """LIVE_EVERY_S (server_report.c): a decode that lasts seconds sends TIERS + EMAP and HITS at least
    once a second between its DATA frames, not only in the turn-end block, so that the atlas moves
    while a slow big model decodes. Each live EMAP agrees with the TIERS line sent with it."""
    eng = spawn(model="endless", slots=1, ctx=LONG_CTX, EXPERT_RAM_MB="1")
    rid, r = _long_request(eng, 0, LONG)
    t0 = time.monotonic()
    eng.wait(lambda: r.finished or time.monotonic() - t0 > 3.5, timeout=10 * SCALE, what="3.5 s of decoding")
    eng.stop(rid)
    eng.result(rid)
    with eng.cond:
        during = [(k, p) for k, p, _ in eng.events[r.first_event:r.last_event] if k in ("EMAP", "TIERS", "HITS")]
    emaps = [p for k, p in during if k == "EMAP"]
    assert len(emaps) >= 3, f"{len(emaps)} EMAP lines during a 3.5 s decode (expected one a second)"
    assert sum(k == "HITS" for k, _ in during) >= 3
    for i, (k, p) in enumerate(during):
        if k == "EMAP":
            tiers = [q for kk, q in during[:i] if kk == "TIERS"]
            assert tiers, "an EMAP during the decode without the TIERS line before it"
            vram, ram, disk = map(int, tiers[-1][1:4])
            c = tier_counts(bytes.fromhex(p[3]))
            assert (c[2], c[1], c[0]) == (vram, ram, disk), f"live TIERS {tiers[-1]} vs EMAP tiers {c}"


def test_it_slot_busy(spawn):
    # The EOS-muted fixture, greedy: request a cannot end by itself before b arrives (sampled at
    # temperature 1 it could: its markup rows are only near-zero, not impossible).
    eng = spawn(model="endless", slots=16, ctx=LONG_CTX)
    a, fa = eng.submit(chatml(LONG[0]), slot=11, max_tokens=LONG_CTX - 1024, temperature=0.0, write=False)
    b, fb = eng.submit(chatml("hi"), slot=11, max_tokens=4, write=False)
    eng.write(fa + fb)
    rb = eng.result(b)
    ra = eng.reqs[a]
    assert ra.accept is not None
    assert rb.codes == ["SLOT_BUSY"] and rb.accept is None, (
        f"second SUBMIT on a busy slot: errors {rb.errors}, accept {rb.accept}; first request finished={ra.finished}")
    eng.stop(a)
    eng.result(a)
    assert ra.done is not None


def test_it_duplicate_id(spawn):
    eng = spawn(model="endless", slots=16, ctx=LONG_CTX)  # a cannot end by itself before b arrives
    a, fa = eng.submit(chatml(LONG[1]), slot=12, max_tokens=LONG_CTX - 1024, temperature=0.0, write=False)
    _, fb = eng.submit(chatml("hi"), slot=13, max_tokens=4, rid=a, write=False)
    m = eng.mark()
    eng.write(fa + fb)
    ra = eng.reqs[a]
    eng.wait(lambda: ra.errors or ra.done is not None, what=f"DUPLICATE_ID for {a}")
    assert ra.codes == ["DUPLICATE_ID"], f"errors {ra.errors}, done {ra.done}"
    eng.stop(a)
    eng.result(a)
    assert ra.done is not None and ra.codes == ["DUPLICATE_ID"]
    assert eng.sync(since=m) == []


def test_it_empty_prompt(eng):
    m = eng.mark()
    rid = eng.submit(b"", slot=14, max_tokens=4)
    r = eng.result(rid)
    assert r.codes == ["EMPTY_PROMPT"] and r.accept is None, r.errors
    assert eng.sync(since=m) == []


def test_it_not_found(eng):
    a, b = new_id(), new_id()
    eng.stop(a)
    eng.cancel(b)
    eng.wait(lambda: eng.reqs.get(a) and eng.reqs[a].errors and eng.reqs.get(b) and eng.reqs[b].errors,
             what="NOT_FOUND answers")
    assert eng.reqs[a].codes == ["NOT_FOUND"] and eng.reqs[b].codes == ["NOT_FOUND"]


def test_it_bad_request_no_desync(eng):
    def sub(rid, slot, n, rest, payload):
        return f"SUBMIT {rid} {slot} {n} {rest}\n".encode() + payload + b"\n"

    hi = b"hi"
    sneaky = b"hi\nSTOP 77"   # would answer NOT_FOUND 77 if this payload were re-read as commands
    header_rejects = [
        sub(new_id(), 14, len(sneaky), "8 5 1", sneaky),          # temperature 5
        sub(new_id(), 14, 2, "8 0 0", hi),                        # top_p 0
        sub(new_id(), 14, 2, "8 0 1.5", hi),                      # top_p > 1
        sub(new_id(), 14, 2, "8 -1 1", hi),                       # temperature < 0
        sub(new_id(), 14, 2, "8 nan 1", hi),                      # temperature not finite
        sub(0, 14, 2, "8 0 1", hi),                               # id 0
        sub(new_id(), 14, 2, "0 0 1", hi),                        # max_tokens 0
        sub(new_id(), 14, 2, "8 0 1 0 9", hi),                    # extra positional field
        sub(new_id(), 14, 2, "8 0 1 0 foo=1", hi),                # unknown key
        sub("abc", 14, 2, "8 0 1", hi),                           # id not a number
        sub(new_id(), -1, 2, "8 0 1", hi),                        # negative slot
        b"HELLO world\n",                                         # unknown verb
        b"\n",                                                    # blank line
        b"STOP\n", b"STOP 0\n", b"STOP 5 x\n", b"CANCEL\n", b"CANCEL abc\n",
    ]
    problems = []
    for fr in header_rejects:
        m = eng.mark()
        eng.write(fr)
        got = eng.sync(since=m)
        if got != [["BAD_REQUEST"]]:
            problems.append(f"{fr[:60]!r}: expected exactly one 'ERROR 0 BAD_REQUEST', got {got}")
    if 77 in eng.reqs:
        problems.append(f"payload of a rejected SUBMIT was executed as a command: {eng.reqs[77].errors}")
    # Rejections that name the request (payload consumed, stream in sync).
    for slot, payload, what in [(16, hi, "slot >= KV_SLOTS"), (14, b"a\x00b", "NUL in payload")]:
        m = eng.mark()
        rid = eng.submit(payload, slot=slot, max_tokens=4)
        r = eng.result(rid)
        got0 = eng.sync(since=m)
        if r.codes != ["BAD_REQUEST"] or got0:
            problems.append(f"{what}: expected 'ERROR {rid} BAD_REQUEST', got {r.errors}, ERROR 0: {got0}")
    assert not problems, "\n".join(problems)
    r = eng.generate(chatml("Still in sync?"), slot=14, max_tokens=4)
    check_done(r, 4)


def test_it_context_exceeded(eng):
    limit = CTX - 2
    rid = eng.submit("0123456789" * 60, slot=15, max_tokens=4)
    r = eng.result(rid)
    assert r.accept is None and len(r.errors) == 1 and r.errors[0][0] == "CONTEXT_EXCEEDED", r.errors
    assert len(r.errors[0]) == 3, f"expected CONTEXT_EXCEEDED <n> <limit>, got {r.errors[0]}"
    n, lim = int(r.errors[0][1]), int(r.errors[0][2])
    assert lim == limit and n > limit, r.errors[0]
    # Boundary: CTX-2 prompt tokens are accepted (one digit = one token), CTX-1 refused.
    rid = eng.submit("7" * limit, slot=15, max_tokens=4)
    r = eng.result(rid)
    assert r.done is not None, f"a prompt of exactly CTX-2 = {limit} tokens was refused: {r.errors}"
    assert r.prompt_tokens == limit
    s = check_done(r, 4)
    assert s["emitted"] <= 1, "max_tokens must be clamped to CTX - prompt - 1"
    rid = eng.submit("7" * (limit + 1), slot=15, max_tokens=4)
    r = eng.result(rid)
    assert r.codes == ["CONTEXT_EXCEEDED"] and r.errors[0][1:] == [str(limit + 1), str(limit)], r.errors
    # Engine still alive and serving.
    r = eng.generate(chatml("short"), slot=15, max_tokens=4)
    check_done(r, 4)


def test_it_max_tokens_clamped(eng):
    r = eng.generate("5" * 500, slot=15, max_tokens=100000)
    s = r.stat()
    room = CTX - 500 - 1
    assert s["emitted"] <= room
    if s["length_limited"]:
        assert s["emitted"] == room, f"clamped request: DONE {' '.join(r.done)}, expected {room} tokens"


def test_it_emap_hits(eng):
    before = parse_map(eng.latest["EMAP"], "EMAP")[2]
    r = eng.generate(chatml("Explain how a mixture of experts works."), slot=4, max_tokens=30, temperature=0.8)
    check_block(r)
    emap = parse_map(r.block_line("EMAP"), "EMAP")[2]
    hits_lines = [ln for ln in r.block if ln.startswith("HITS ")]
    union = [0] * (ROWS * COLS)
    for ln in hits_lines:
        _, _, h = parse_map(ln, "HITS")
        # bits past rows*cols (padding of the last byte) must be zero
        assert all(((h[-1] >> b) & 1) == 0 for b in range((ROWS * COLS) % 8 or 8, 8)), ln
        for i, bit in enumerate(hits_bits(h, ROWS * COLS)):
            union[i] |= bit
    for i, bit in enumerate(union):
        if bit:
            assert emap[i] & 63 > 0, f"expert row {i // COLS} col {i % COLS} in HITS but heat 0 in EMAP (LSB-first?)"
    for row in range(ROWS):
        assert sum(union[row * COLS:(row + 1) * COLS]) >= TOP_K, f"row {row}: fewer than top-k experts routed this turn"
    for i in range(ROWS * COLS):
        assert emap[i] & 63 >= before[i] & 63, "heat decreased"
    if r.stat()["emitted"] >= 13:
        assert len(hits_lines) >= 2, f"no mid-turn HITS in a {r.stat()['emitted']}-token turn: {hits_lines}"


def test_it_utf8_payloads(eng):
    prompts = ["Écris un poème sur la mer 🌊 et 東京.", "Привет! Как дела? 😀", "def f(x):\n    return x * 2\n",
               "Random bytes please: ñ ü ß 漢字 🚀"]
    problems = []
    for temp in (1.0, 2.0):
        ids = [eng.submit(chatml(p), slot=1 + (i % 2), max_tokens=48, temperature=temp, top_p=1)
               if i < 2 else None for i, p in enumerate(prompts)]
        rs = [eng.result(i) for i in ids if i]
        ids2 = [eng.submit(chatml(p), slot=1 + (i % 2), max_tokens=48, temperature=temp, top_p=1)
                for i, p in enumerate(prompts[2:])]
        rs += [eng.result(i) for i in ids2]
        for r in rs:
            assert r.done is not None, r.errors
            for j, d in enumerate(r.data):
                try:
                    d.decode("utf-8", "strict")
                except UnicodeDecodeError as ex:
                    problems.append(f"T={temp} request {r.id} DATA #{j} {d!r}: {ex}")
            try:
                r.text.decode("utf-8", "strict")
            except UnicodeDecodeError as ex:
                problems.append(f"T={temp} request {r.id} whole text not UTF-8: {ex}")
    assert not problems, "\n".join(problems[:20])
