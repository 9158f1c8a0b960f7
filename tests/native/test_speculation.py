"""Speculative decoding in serve mode (native/src/server_spec.c): a step forwards the request's
next token with up to SPEC_DRAFT drafted ones as one batch, keeps the drafts the model would have
chosen itself and cuts the slot back after the first it would not.

The oracle is the engine's own plain greedy run, which the other tests hold to the float64
references: with EXACT=1 a drafting run must emit the same tokens, turn after turn on one slot,
whatever share of the drafts is wrong. The drafts are a recorded run's tokens (SPEC_RECORD) with a
share replaced (SPEC_REPLAY, SPEC_CORRUPT): a stand-in draft source whose acceptance the test sets.
Each architecture family is here: a transformer MoE (K/V truncated), gpt-oss (sliding-window
layers: the window's rows must survive the cut) and qwen35moe (Gated DeltaNet: the recurrent
state comes back from the trail of the verify batch).
"""
from __future__ import annotations

import pytest

from tests.native.engine import Engine, base_env, two_turns
from tests.support import procs

TOKENS = 40


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    return {
        "qwen3moe": procs.make_tiny_model(d / "moe.gguf"),
        "gpt-oss": procs.make_arch_fixture(d / "gptoss.gguf", "gpt-oss"),
        "qwen35moe": procs.make_tiny_qwen35moe(d / "q35.gguf"),
    }


def spec_line(req) -> dict:
    line = req.block_line("SPEC")
    assert line is not None, "no SPEC line at the end of a drafting turn"
    f = line.split()
    return {"steps": int(f[2]), "drafted": int(f[3]), "accepted": int(f[4]), "emitted": int(f[5]),
            "plain_steps": int(f[7]), "guesses": int(f[11]), "guesses_right": int(f[12])}


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "qwen35moe"])
def test_drafting_emits_the_plain_greedy_tokens(engine_binary, models, tmp_path, arch):
    rec = tmp_path / "record.txt"
    plain, (p1, p2) = two_turns(engine_binary, models[arch], TOKENS, SPEC_RECORD=rec)
    lines = rec.read_text().splitlines()
    assert len(lines) == 2 and len(lines[0].split()) == p1.stat()["emitted"], lines
    for corrupt, draft in (("0", 3), ("0.3", 3), ("0.5", 2), ("1", 1)):
        texts, reqs = two_turns(engine_binary, models[arch], TOKENS, SPEC_DRAFT=draft,
                                SPEC_POLICY="always", SPEC_REPLAY=rec, SPEC_CORRUPT=corrupt)
        assert texts == plain, f"SPEC_CORRUPT={corrupt}: drafting changed the greedy output"
        assert reqs[1].reused == p2.reused > 0, (
            f"the second turn did not resume the slot cut back by the verify batches as a plain slot: "
            f"reused {reqs[1].reused}, plain {p2.reused}")
        for r in reqs:
            s = spec_line(r)
            # the first token comes from the prefill; a plain step that ends the turn sends none
            assert s["emitted"] + s["plain_steps"] + 1 - r.stat()["emitted"] in (0, 1), (s, r.stat())
            assert 0 <= s["accepted"] <= s["drafted"], s
            if corrupt == "0":
                # every draft right: each step emits its drafts and one more, unless the budget ends it
                assert s["accepted"] == s["drafted"] and s["steps"] <= -(-r.stat()["emitted"] // (draft + 1)) + 1, s
            elif corrupt == "1":
                assert s["accepted"] == 0, s
            else:
                assert 0 < s["accepted"] < s["drafted"], s


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen35moe"])
def test_drafting_keeps_a_seeded_sampled_turn(engine_binary, models, tmp_path, arch):
    """Sampling: a draft is kept when the request's own sample is that token, and the emission
    replays the same RNG draws, so a seeded EXACT turn emits the plain run's samples whatever
    share of the drafts is wrong (and the sampler is really sampling: the greedy turn differs)."""
    rec = tmp_path / "record.txt"
    sampled = {"temperature": 0.9, "extra": " seed=7 top_k=40"}
    greedy, _ = two_turns(engine_binary, models[arch], TOKENS)
    plain, _ = two_turns(engine_binary, models[arch], TOKENS, SPEC_RECORD=rec, **sampled)
    assert plain != greedy, "temperature 0.9 sampled the greedy tokens: the test would not see the sampler"
    for corrupt in ("0", "0.3"):
        texts, reqs = two_turns(engine_binary, models[arch], TOKENS, SPEC_DRAFT=2, SPEC_POLICY="always",
                                   SPEC_REPLAY=rec, SPEC_CORRUPT=corrupt, **sampled)
        assert texts == plain, f"SPEC_CORRUPT={corrupt}: drafting changed the seeded samples"
        s = spec_line(reqs[0])
        if corrupt == "0":
            assert 0 < s["accepted"] == s["drafted"], s
        else:
            assert 0 < s["accepted"] < s["drafted"], s


def test_policy_stops_drafting_that_never_pays(engine_binary, models, tmp_path):
    """Every draft wrong: the adaptive policy's tries are lone guesses beside plain steps, each
    wrong, each followed by a pause (32, then 64 steps): no verify batch at all, a few guesses."""
    rec = tmp_path / "record.txt"
    two_turns(engine_binary, models["qwen35moe"], TOKENS, SPEC_RECORD=rec)
    _, (r1, r2) = two_turns(engine_binary, models["qwen35moe"], TOKENS, SPEC_DRAFT=3,
                            SPEC_REPLAY=rec, SPEC_CORRUPT="1")
    for r in (r1, r2):
        s = spec_line(r)
        assert s["steps"] == 0 and s["drafted"] == 0 and 1 <= s["guesses"] <= 2 and s["guesses_right"] == 0, s


def test_policy_drafts_when_guesses_are_right(engine_binary, models, tmp_path):
    """Every draft right: the lone guess is right, and drafting takes over from there (the timing
    decides how many drafts; here at least some steps draft and every draft is kept)."""
    rec = tmp_path / "record.txt"
    plain, _ = two_turns(engine_binary, models["qwen35moe"], TOKENS, SPEC_RECORD=rec)
    texts, (r1, r2) = two_turns(engine_binary, models["qwen35moe"], TOKENS, SPEC_DRAFT=3, SPEC_REPLAY=rec,
                                   SPEC_CORRUPT="0")
    assert texts == plain
    s = spec_line(r1)
    assert s["guesses"] >= 1 and s["guesses_right"] >= 1 and s["steps"] >= 1 and s["accepted"] == s["drafted"], s


def test_bad_settings_are_refused(engine_binary, models, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 three\n")
    cases = [({"SPEC_DRAFT": 2}, "SPEC_DRAFT needs a draft source"),
             ({"SPEC_DRAFT": 9, "SPEC_REPLAY": bad}, "SPEC_DRAFT must be an integer in 0..4"),
             ({"SPEC_DRAFT": 2, "SPEC_REPLAY": bad}, "not a readable file of token ids"),
             ({"SPEC_DRAFT": 2, "SPEC_REPLAY": tmp_path / "absent"}, "not a readable file"),
             ({"SPEC_POLICY": "sometimes"}, "SPEC_POLICY must be adaptive or always"),
             ({"SPEC_CORRUPT": "1.5"}, "SPEC_CORRUPT must be a share in 0..1")]
    for env, message in cases:
        e = Engine(engine_binary, env=base_env(models["qwen3moe"], slots=1, **env), wait_ready=False)
        try:
            assert e.wait_exit(30) == 2, env
            assert message in e.stderr_text(), (env, e.stderr_text()[-400:])
        finally:
            e.kill()
