"""Off-by-default mux extensions (native/README.md "Commands", "Responses per request",
"Handshake"): SUBMIT's `routes=1` (a ROUTES line of the turn's expert selection counts) and
`routes=2` (also a ROUTESTEP line per generated token forwarded),
`heat=0` (selections kept out of the cumulative usage heat) and MODEL's `sampling` (the file's
general.sampling.* recommendation)."""
from __future__ import annotations

import math

import pytest

from tests.native.engine import SCALE, chatml, hits_bits, parse_map, parse_model_line
from tests.support import procs

pytestmark = pytest.mark.timeout(int(120 * SCALE))

ROWS, COLS, TOP_K = 4, 8, 2
PROMPT = chatml("Name three rivers and the seas they reach.")


def parse_routes(line: str, rid: int):
    """ROUTES <id> <rows> <cols> <row>:<expert>:<count>... -> (rows, cols, {(row, expert): count})"""
    p = line.split(" ")
    assert p[0] == "ROUTES" and int(p[1]) == rid, line
    rows, cols = int(p[2]), int(p[3])
    cells, keys = {}, []
    for t in p[4:]:
        r, e, c = map(int, t.split(":"))
        assert 0 <= r < rows and 0 <= e < cols and c > 0, f"bad triple {t} in {line!r}"
        keys.append((r, e))
        cells[(r, e)] = c
    assert keys == sorted(set(keys)), f"triples not sorted by row then expert, or repeated: {line!r}"
    return rows, cols, cells


def test_routes_line_counts_the_turn(eng):
    r = eng.result(eng.submit(PROMPT, slot=0, max_tokens=12, extra=" routes=1"))
    kinds = [ln.split(" ", 1)[0] for ln in r.block]
    assert "ROUTES" in kinds, kinds
    assert kinds.index("ENTROPY") < kinds.index("ROUTES"), f"ROUTES not after ENTROPY: {kinds}"
    rows, cols, cells = parse_routes(r.block_line("ROUTES"), r.id)
    assert (rows, cols) == (ROWS, COLS)
    forwarded = r.prompt_tokens - r.reused + r.stat()["emitted"] - r.stat()["length_limited"]
    ent = [float(h) for h in r.block_line("ENTROPY").split(" ")[1:]]
    for row in range(rows):
        c = [cells.get((row, e), 0) for e in range(cols)]
        # every forwarded position chose top_k experts in every MoE layer
        assert sum(c) == TOP_K * forwarded, (row, c, forwarded)
        tot = sum(c)
        h = -sum(x / tot * math.log2(x / tot) for x in c if x)
        assert abs(h - ent[row]) < 1.5e-3, f"row {row}: ENTROPY {ent[row]} but ROUTES give {h:.4f}"
    # off by default and with routes=0
    for extra in ("", " routes=0"):
        q = eng.result(eng.submit(PROMPT, slot=1, max_tokens=4, extra=extra))
        assert q.block_line("ROUTES") is None, q.block


def test_routes_on_a_dense_model(spawn):
    d = spawn(model="dense", slots=1)
    r = d.result(d.submit(PROMPT, max_tokens=4, extra=" routes=1"))
    assert r.block_line("ROUTES") == f"ROUTES {r.id} 0 0", r.block


def parse_routestep(line: str, rid: int) -> list[list[int]]:
    """ROUTESTEP <id> <rows> <cols> <k> <hex> -> per MoE row, the k experts that token selected."""
    p = line.split(" ")
    assert p[0] == "ROUTESTEP" and int(p[1]) == rid and len(p) == 6, line
    rows, cols, k = int(p[2]), int(p[3]), int(p[4])
    assert (rows, cols, k) == (ROWS, COLS, TOP_K) and len(p[5]) == rows * k * 2, line
    ids = list(bytes.fromhex(p[5]))
    return [ids[r * k:(r + 1) * k] for r in range(rows)]


def test_routestep_lines_are_each_forwarded_tokens_selections(spawn):
    """routes=2: one ROUTESTEP per generated token the turn forwards, between that token's DATA and
    the next; with the prefill's counts (a max_tokens=1 turn's ROUTES on a fresh slot) they add up
    to the turn's ROUTES exactly, cell by cell."""
    e = spawn(slots=2)
    e.sync()  # the handshake's lines are all read
    assert parse_model_line(e.latest["MODEL"]).get("routes") == 2
    r = e.result(e.submit(PROMPT, slot=0, max_tokens=12, extra=" routes=2"))
    probe = e.result(e.submit(PROMPT, slot=1, max_tokens=1, extra=" routes=1 heat=0"))
    assert r.reused == probe.reused == 0 and probe.stat()["emitted"] == 1
    kinds = [k for k, parts, _ in e.events[r.first_event:r.last_event + 1]
             if k in ("DATA", "ROUTESTEP") and int(parts[1]) == r.id]
    emitted, limited = r.stat()["emitted"], r.stat()["length_limited"]
    assert emitted >= 3, "too short a turn to test"
    steps = emitted - limited  # the last token is forwarded only when an end-of-generation token followed it
    assert kinds == (["DATA", "ROUTESTEP"] * emitted)[:emitted + steps], kinds
    lines = [" ".join(parts) for k, parts, _ in e.events[r.first_event:r.last_event + 1] if k == "ROUTESTEP"]
    picked = [0] * (ROWS * COLS)
    for ln in lines:
        for row, experts in enumerate(parse_routestep(ln, r.id)):
            assert len(set(experts)) == TOP_K and all(x < COLS for x in experts), ln
            for x in experts:
                picked[row * COLS + x] += 1
    _, _, turn = parse_routes(r.block_line("ROUTES"), r.id)
    _, _, prefill = parse_routes(probe.block_line("ROUTES"), probe.id)
    for i in range(ROWS * COLS):
        cell = (i // COLS, i % COLS)
        assert prefill.get(cell, 0) + picked[i] == turn.get(cell, 0), (cell, prefill.get(cell), picked[i], turn.get(cell))
    # off without routes=2
    q = e.result(e.submit(PROMPT, slot=0, max_tokens=4, extra=" routes=1"))
    assert not [k for k, parts, _ in e.events[q.first_event:q.last_event + 1] if k == "ROUTESTEP"]


def test_routestep_on_a_dense_model(spawn):
    d = spawn(model="dense", slots=1)
    r = d.result(d.submit(PROMPT, max_tokens=4, extra=" routes=2"))
    assert r.block_line("ROUTES") == f"ROUTES {r.id} 0 0", r.block
    assert not [k for k, _, _ in d.events[r.first_event:r.last_event + 1] if k == "ROUTESTEP"]


@pytest.mark.parametrize("extra", [" routes=3", " heat=2", " routes=1 routes=1", " heat=0 heat=0",
                                   " routes=", " heat=-1", " routes=yes"])
def test_bad_routes_or_heat_rejects_the_header(eng, extra):
    n0 = len(eng.errors0)
    rid = eng.submit(b"hi\nSTOP 77", slot=2, max_tokens=4, extra=extra)
    eng.wait(lambda: len(eng.errors0) > n0, what="ERROR 0")
    assert eng.errors0[n0] == ["BAD_REQUEST"], eng.errors0
    ok = eng.result(eng.submit(PROMPT, slot=2, max_tokens=2))   # the stream stays in sync
    assert ok.done is not None and not eng._req(rid).accept


def heat(emap: bytes) -> list[int]:
    return [b & 63 for b in emap]


def test_heat0_leaves_usage_heat_alone(spawn):
    e = spawn(slots=2)
    e.wait(lambda: "EMAP" in e.latest, what="EMAP")
    before = parse_map(e.latest["EMAP"], "EMAP")[2]
    r = e.result(e.submit(PROMPT, slot=0, max_tokens=10, extra=" heat=0 routes=1"))
    after = parse_map(r.block_line("EMAP"), "EMAP")[2]
    assert heat(after) == heat(before), "a heat=0 request changed the EMAP heat"
    # HITS and ROUTES still see its selections
    union = [0] * (ROWS * COLS)
    for ln in r.block:
        if ln.startswith("HITS "):
            for i, b in enumerate(hits_bits(parse_map(ln, "HITS")[2], ROWS * COLS)):
                union[i] |= b
    _, _, cells = parse_routes(r.block_line("ROUTES"), r.id)
    assert {row * COLS + ex for row, ex in cells} <= {i for i, b in enumerate(union) if b}
    assert sum(union) > 0
    r2 = e.result(e.submit(PROMPT, slot=1, max_tokens=10))
    after2 = parse_map(r2.block_line("EMAP"), "EMAP")[2]
    assert heat(after2) != heat(after), "a heat=1 request did not change the EMAP heat"
    assert all(a >= b for a, b in zip(heat(after2), heat(after)))


def test_model_line_sampling(spawn, tmp_path):
    e = spawn(slots=1)
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    assert parse_model_line(e.latest["MODEL"])["sampling"] is None
    both = procs.make_tiny_model(tmp_path / "samp.gguf", "--sampling-temp", "0.2", "--sampling-top-p", "0.9")
    e = spawn(model=str(both), slots=1)
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    assert parse_model_line(e.latest["MODEL"])["sampling"] == {"temperature": 0.2, "top_p": 0.9}
    k = procs.make_tiny_model(tmp_path / "topk.gguf", "--sampling-top-k", "40")
    e = spawn(model=str(k), slots=1)
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    assert parse_model_line(e.latest["MODEL"])["sampling"] == {"top_k": 40}


def data_tails(eng, rid):
    """The DATA headers' fields after `DATA <id> <n>` of request rid, in order."""
    return [parts[3:] for kind, parts, _ in list(eng.events) if kind == "DATA" and int(parts[1]) == rid]


def test_top_k_1_is_greedy_whatever_the_temperature(eng):
    greedy = eng.result(eng.submit(PROMPT, slot=3, max_tokens=10)).text
    for seed in (1, 2, 3):
        hot = eng.result(eng.submit(PROMPT, slot=3, max_tokens=10, temperature=1.9, extra=f" top_k=1 seed={seed}"))
        assert hot.text == greedy


def test_top_k_samples_only_among_the_k_most_likely(eng):
    """Each sampled token's logprob is at least the k-th candidate's (the logprobs tail lists the
    five most likely under the raw logits; the cut is applied to the same logits)."""
    seen_beyond_1 = False
    for seed in range(4):
        r = eng.result(eng.submit(PROMPT, slot=4, max_tokens=12, temperature=2, extra=f" top_k=3 logprobs=5 seed={seed}"))
        for tail in data_tails(eng, r.id):
            lp, k = float(tail[0]), int(tail[1])
            cands = [float(tail[3 + 2 * i]) for i in range(k)]
            assert lp >= cands[2] - 1e-3, (lp, cands)
            seen_beyond_1 |= lp < cands[0] - 1e-3
    assert seen_beyond_1, "temperature 2 with top_k=3 never sampled past the most likely token"


def test_lptext_carries_the_sampled_and_candidate_token_bytes(eng):
    r = eng.result(eng.submit(PROMPT, slot=5, max_tokens=10, extra=" logprobs=3 lptext=1"))
    tails = data_tails(eng, r.id)
    assert tails and all(len(t) == 2 + 2 * 3 + 1 + 3 for t in tails), tails[:2]
    raw, by_id = b"", {}
    for t in tails:
        hexes = [b"" if h == "-" else bytes.fromhex(h) for h in t[8:]]
        assert hexes[0] == hexes[1], "greedy: the sampled token is the most likely candidate"
        raw += hexes[0]
        for i in range(3):
            assert by_id.setdefault(int(t[2 + 2 * i]), hexes[1 + i]) == hexes[1 + i]
    try:
        assert raw.decode("utf-8") == r.text.decode("utf-8")
    except UnicodeDecodeError:
        pass  # the sanitizer's U+FFFD differs from raw bytes: only valid text is compared
    plain = eng.result(eng.submit(PROMPT, slot=5, max_tokens=4, extra=" logprobs=3"))
    assert all(len(t) == 2 + 2 * 3 for t in data_tails(eng, plain.id))


@pytest.mark.parametrize("extra", [" top_k=-1", " top_k=x", " top_k=1 top_k=1", " lptext=2", " lptext=1 lptext=1"])
def test_bad_top_k_or_lptext_rejects_the_header(eng, extra):
    n0 = len(eng.errors0)
    eng.submit(b"hi", slot=6, max_tokens=4, extra=extra)
    eng.wait(lambda: len(eng.errors0) > n0, what="ERROR 0")
    assert eng.errors0[n0] == ["BAD_REQUEST"], eng.errors0
