"""Per-request expert count: SUBMIT's `experts=N` key (native/README.md, docs/contracts.md).

Each request may route its tokens through N of the model's experts (1 .. MODEL's
experts_max) instead of the model's default (MODEL's top_k), also inside a batch with
requests using other counts. An out-of-range N is a request-level BAD_REQUEST (payload
consumed); a malformed or repeated key rejects the header like any other key. K/V rows
computed with one count are never reused by a turn (or a restarted engine) using another.
"""
from __future__ import annotations

from tests.native.engine import chatml, parse_model_line

PROMPT = chatml("Tell me a story about a fox and a dog.")


def test_it_announces_the_expert_range(spawn):
    e = spawn(slots=1)
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    m = parse_model_line(e.latest["MODEL"])
    assert (m["top_k"], m["experts_min"], m["experts_max"], m["n_experts"]) == (2, 1, 8, 8), m
    d = spawn(model="dense", slots=1)
    d.wait(lambda: "MODEL" in d.latest, what="MODEL line")
    m = parse_model_line(d.latest["MODEL"])
    assert (m["top_k"], m["experts_min"], m["experts_max"]) == (0, 0, 0), m


def test_it_routes_each_request_through_its_own_count_in_one_batch(spawn):
    e = spawn(slots=4)
    alone = {}
    for k in (1, 2, 8):
        r = e.result(e.submit(PROMPT, slot=0, max_tokens=24, extra=f" experts={k}"))
        assert r.done is not None, r.errors
        alone[k] = r.text
        if k == 8:   # every expert of every layer on every token: uniform, 3 bits per layer
            ent = r.block_line("ENTROPY").split(" ")[1:]
            assert ent and all(x == "3.000" for x in ent), ent
    default = e.generate(PROMPT, slot=1, max_tokens=24)
    assert default.text == alone[2], "experts=2 (the model's top_k) differs from the default"
    assert alone[1] != alone[8], "experts=1 and experts=8 gave the same text"
    # the three counts decoding together in one batch: each as alone
    ids = {k: e.submit(PROMPT, slot=s, max_tokens=24, extra=f" experts={k}") for s, k in enumerate((1, 2, 8))}
    for k, rid in ids.items():
        r = e.result(rid)
        assert r.done is not None, r.errors
        assert r.text == alone[k], f"experts={k} in a mixed batch differs from its run alone"
    assert e.close() == 0


def test_it_rejects_an_out_of_range_count_as_a_request_error(spawn):
    e = spawn(slots=2)
    for k in (0, 9, 1000):
        m = e.mark()
        rid = e.submit(b"hi\nSTOP 77", slot=0, max_tokens=4, extra=f" experts={k}")
        r = e.result(rid)
        assert r.codes == ["BAD_REQUEST"] and e.sync(since=m) == [], (k, r.errors)
    for extra in (" experts=abc", " experts=-1", " experts=2 experts=2", " experts="):
        m = e.mark()
        e.submit(b"hi\nSTOP 77", slot=0, max_tokens=4, extra=extra)
        assert e.sync(since=m) == [["BAD_REQUEST"]], extra
    assert 77 not in e.reqs, "a rejected payload was read as commands"
    d = spawn(model="dense", slots=1)
    r = d.result(d.submit(b"hi", max_tokens=4, extra=" experts=1"))
    assert r.codes == ["BAD_REQUEST"], "a dense model has no experts to choose"
    ok = e.generate(chatml("Still in sync?"), slot=1, max_tokens=4)
    assert ok.done is not None


def test_it_recomputes_a_history_made_with_another_count(spawn, tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    e = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir)
    r1 = e.result(e.submit(PROMPT, slot=0, max_tokens=8, extra=" experts=5"))
    follow = PROMPT + r1.text.decode("utf-8") + "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n"
    same = e.result(e.submit(follow, slot=0, max_tokens=4, extra=" experts=5"))
    assert same.reused >= r1.prompt_tokens - 1, same.accept
    other = e.result(e.submit(follow, slot=0, max_tokens=4))
    assert other.reused == 0, f"rows made with experts=5 reused by a top-2 turn: {other.accept}"
    fresh = e.result(e.submit(follow, slot=1, max_tokens=4))
    assert other.text == fresh.text
    back = e.result(e.submit(follow, slot=1, max_tokens=4, extra=" experts=5"))
    assert back.reused == 0 and back.text == same.text, back.accept
    assert e.close() == 0
    # slot 1 was saved with experts=5: a restarted engine (default count) must not resume it
    e2 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir)
    r = e2.result(e2.submit(follow, slot=1, max_tokens=4))
    assert r.reused == 0, f"a slot file made with experts=5 was resumed at top-2: {r.accept}"
    r = e2.result(e2.submit(follow, slot=1, max_tokens=4, extra=" experts=5"))
    assert r.reused == 0 and r.text == same.text
    assert e2.close() == 0
