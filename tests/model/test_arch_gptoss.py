"""gpt-oss (llama.cpp's openai-moe graph): tiny files of native/tools/make_tiny_gptoss.py (attention
sinks, a sliding window of 8 keys on layers 0 and 2, YaRN, biases everywhere, router bias with a
softmax over the top 4, clamped SwiGLU) against the float64 GptOss reference of arch_ref.py.

- EXACT=1 (float activations, KV f32) on a prompt three windows long plus 12 greedy steps, on the
  F32 file and on the MXFP4-experts one (--mix mxfp4; the reference dequantizes with gguf's): the
  reference's greedy tokens, max |d log-prob| <= 2e-3 (the oracle's bar); the int8 default within
  test_arch_oracle's loose guard. The clamps are reached (the reference counts them) and the
  windows slide (the C side keeps only 2 windows of rows per sliding layer: one row at a time and
  all at once give the same bits).
- gpt-oss-20b's widths (d_model 2880, 64 query / 8 KV heads of 64) with MXFP4 experts and BF16
  attention, 2 layers: EXACT=1 = the reference (make_tiny_gptoss.py --widths 20b).
- One slot over stateless turns (the mux engine): a turn that diverges right after the previous
  prompt (past rows its windows dropped: the checkpoint taken where that prompt ended is
  restored), one that continues the conversation (the windows' rows are live), and one that
  diverges inside the first prompt (recomputed from 0): each turn's tokens and log-probabilities
  are those of a fresh engine given the same prompt, and ACCEPT's reused= says which path ran.
- Two slots decoding in one batch: each turn = the same turn alone.
- A slot file (KVSAVE=1) carries the windows and their checkpoint across a restart; the
  sliding_window_pattern key is read as llama.cpp reads it; a file without one of the tensors the
  loader requires is refused naming it.
The Q4_K_M file runs in test_arch_oracle.py's CASES and the per-tensor type mixes in
test_arch_type_mixes.py (both through procs.make_arch_fixture).
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from tests.model import arch_ref
from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.native.engine import Engine, base_env
from tests.support import procs

WINDOW = 8
PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64, 3, 77, 150, 201, 12, 9, 300, 41, 66, 130, 88, 2, 19, 240]
STEPS = 12
TOL_EXACT = 2e-3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """mix -> the tiny file (made once per module)."""
    d, made = tmp_path_factory.mktemp("gptoss"), {}

    def get(mix: str):
        if mix not in made:
            made[mix] = procs.make_arch_fixture(d / f"gpt-oss-{mix}.gguf", "gpt-oss", "--window", str(WINDOW),
                                                "--mix", mix)
        return made[mix]
    return get


@pytest.fixture(scope="module")
def tiny(files):
    return files("f32")


def dump(fwd_dump, model, ids, tmp_path, **env) -> np.ndarray:
    out = tmp_path / "logits.f32"
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True, env=dict(os.environ, **env))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


@pytest.mark.parametrize("mix", ["f32", "mxfp4"])
def test_matches_reference_past_the_window(mix, files, fwd_dump, tmp_path, monkeypatch):
    """F32, and the experts in MXFP4 with BF16 elsewhere (gpt-oss's releases)."""
    tiny = files(mix)
    ref = REFS["gpt-oss"](str(tiny))
    assert ref.window == WINDOW and len(PROMPT) >= 3 * WINDOW
    clamped = [0, 0]
    act = arch_ref.swiglu_oai

    def counting(g, u, **kw):
        clamped[0] += int((g > 7).sum())
        clamped[1] += int((np.abs(u) > 7).sum())
        return act(g, u, **kw)

    monkeypatch.setattr(arch_ref, "swiglu_oai", counting)
    ids = greedy(ref, PROMPT, STEPS)
    ref_lp = log_softmax(ref.forward(ids))
    assert clamped[0] > 0 and clamped[1] > 0, f"the tiny file never reaches the clamps: {clamped}"
    steps = range(len(PROMPT) - 1, len(ids) - 1)
    for label, env, tol, off_max in (("EXACT=1", dict(EXACT="1", KV_TYPE="f32"), TOL_EXACT, 0),
                                     ("int8 default", {}, 1.0, 2)):
        lp = log_softmax(dump(fwd_dump, tiny, ids, tmp_path, **env))
        assert np.isfinite(lp).all()
        off = sum(int(np.argmax(lp[p]) != ids[p + 1]) for p in steps)
        err = max(float(np.abs(ref_lp[p, np.argsort(-ref_lp[p])[:32]] - lp[p, np.argsort(-ref_lp[p])[:32]]).max())
                  for p in range(len(ids) - 1))
        print(f"gpt-oss {mix} {label}: greedy {len(steps) - off}/{len(steps)}, max |d log-prob| {err:.2e} over "
              f"{len(ids)} positions (window {WINDOW})")
        assert off <= off_max, f"{label}: greedy choice off the reference at {off} steps"
        assert err <= tol, f"{label}: log-prob error {err:.3g} > {tol}"


def test_20b_widths_match_reference(tmp_path, fwd_dump):
    """gpt-oss-20b's widths (d_model 2880: 90 blocks of 32, not of 256; 64 query / 8 KV heads of 64),
    MXFP4 experts and BF16 attention as its releases, 2 layers: EXACT=1 = the reference past the
    window (a short continuation: the float64 forward of these widths is slow)."""
    model = procs.make_arch_fixture(tmp_path / "gpt-oss-20b-widths.gguf", "gpt-oss", "--widths", "20b", "--layers", "2",
                                    "--mix", "mxfp4", "--window", str(WINDOW))
    ref = REFS["gpt-oss"](str(model))
    assert (ref.D, ref.H, ref.KVH, ref.HDK) == (2880, 64, 8, 64)
    prompt = PROMPT[:WINDOW + 2]
    ids = greedy(ref, prompt, 3)
    ref_lp = log_softmax(ref.forward(ids))
    steps = range(len(prompt) - 1, len(ids) - 1)
    for label, env, tol, off_max in (("EXACT=1", dict(EXACT="1", KV_TYPE="f32"), TOL_EXACT, 0),
                                     ("int8 default", {}, 1.0, 1)):
        lp = log_softmax(dump(fwd_dump, model, ids, tmp_path, **env))
        off = sum(int(np.argmax(lp[p]) != ids[p + 1]) for p in steps)
        err = max(float(np.abs(ref_lp[p, np.argsort(-ref_lp[p])[:32]] - lp[p, np.argsort(-ref_lp[p])[:32]]).max())
                  for p in range(len(ids) - 1))
        print(f"gpt-oss 20b widths, MXFP4 experts: {label} greedy {len(steps) - off}/{len(steps)}, "
              f"max |d log-prob| {err:.2e} over {len(ids)} positions")
        assert off <= off_max and err <= tol, f"{label}: {off} greedy steps off, log-prob error {err:.3g}"


def test_experts_streamed_in_pieces_give_the_resident_logits(tmp_path, fwd_dump):
    """Experts 1024 wide at gpt-oss-20b's d_model, MXFP4: each slice is 1.57 MB at an offset inside
    a page, so under a budget of one expert every read is its page-aligned cover in two 1 MiB
    pieces (O_DIRECT straight into place, the pieces on different lanes, the lookahead's wrong
    guesses stopped between them). One token at a time (decode batches, with the lookahead), the
    logits equal, to the bit, those with every expert resident and each slice read whole through
    the page cache (EXPERT_DIRECT=0): in EXACT mode, and in the default mode, where the resident
    copies are packed and the streamed ones run the file-layout tile."""
    model = procs.make_arch_fixture(tmp_path / "wide.gguf", "gpt-oss", "--widths", "20b", "--layers", "2",
                                    "--mix", "mxfp4", "--d-expert", "1024", "--window", str(WINDOW))
    ids = PROMPT[:12]
    for exact in ("1", "0"):
        whole = dump(fwd_dump, model, ids, tmp_path, EXACT=exact, FWD_DUMP_SERIAL="1", EXPERT_DIRECT="0")
        for label, env in (("resident", {}),
                           *((f"streamed, {n} lanes", dict(FWD_DUMP_EXPERT_MB="5", IO_LANES=n)) for n in ("4", "1", "0"))):
            got = dump(fwd_dump, model, ids, tmp_path, EXACT=exact, FWD_DUMP_SERIAL="1", **env)
            diff = float(np.abs(got - whole).max())
            assert np.array_equal(got, whole), f"EXACT={exact}, {label}: logits differ by {diff:.3g}"


def test_sliding_window_pattern_key(tmp_path, fwd_dump):
    """attention.sliding_window_pattern 4 (layers 0, 1, 2 slide, 3 attends to everything), as
    llama.cpp's load_swa_pattern reads it: EXACT=1 = the reference, which differs from the
    period-2 file's logits on the same weights."""
    model = procs.make_arch_fixture(tmp_path / "gpt-oss-p4.gguf", "gpt-oss", "--window", str(WINDOW),
                                    "--swa-pattern", "4")
    ref = REFS["gpt-oss"](str(model))
    assert [ref.swa(l) for l in range(4)] == [True, True, True, False]
    ids = PROMPT + [1, 2, 3]
    ref_lp = log_softmax(ref.forward(ids))
    lp = log_softmax(dump(fwd_dump, model, ids, tmp_path, EXACT="1", KV_TYPE="f32"))
    assert float(np.abs(ref_lp - lp).max()) <= TOL_EXACT
    period2 = procs.make_arch_fixture(tmp_path / "gpt-oss-p2.gguf", "gpt-oss", "--window", str(WINDOW))
    assert float(np.abs(log_softmax(dump(fwd_dump, period2, ids, tmp_path, EXACT="1", KV_TYPE="f32")) - lp).max()) > 0.1


@pytest.mark.parametrize("env", [dict(EXACT="1", KV_TYPE="f32"), {}], ids=["exact", "default"])
def test_one_row_at_a_time_equals_one_batch(tiny, fwd_dump, tmp_path, env):
    """The sliding layers' buffers slide while decoding one row at a time (every two windows) and
    grow for a batch: the same rows, the same bits."""
    ids = PROMPT + list(range(40, 60))
    batched = dump(fwd_dump, tiny, ids, tmp_path, **env)
    assert np.array_equal(batched, dump(fwd_dump, tiny, ids, tmp_path, FWD_DUMP_SERIAL="1", **env))


def run_turn(e: Engine, prompt: str, steps: int):
    """(reused, prompt tokens, the DATA lines (token ids, logprobs), text) of one greedy turn on slot 0."""
    rid = e.submit(prompt, slot=0, max_tokens=steps, extra=" logprobs=4")
    r = e.result(rid, 120)
    assert r.done is not None, r.errors
    data = [tuple(parts[2:]) for kind, parts, _ in list(e.events)
            if kind == "DATA" and int(parts[1]) == rid and len(parts) >= 6]
    return r.reused, r.prompt_tokens, data, r.text


def fresh(binary, model, prompt: str, steps: int):
    e = Engine(binary, env=base_env(model, slots=1, ctx=256))
    try:
        return run_turn(e, prompt, steps)[2:]
    finally:
        e.close(10)
        e.kill()


def test_stateless_turns_on_one_slot_reuse_exactly(tiny, engine_binary):
    steps = 3 * WINDOW
    a = "<|im_start|>user\nThe capital of France is a city<|im_end|><|im_start|>"
    e = Engine(engine_binary, env=base_env(tiny, slots=1, ctx=256))
    try:
        reused, n1, d1, t1 = run_turn(e, a, steps)
        assert reused == 0
        assert len(d1) > 2 * WINDOW, f"turn 1 ended after {len(d1)} tokens: its windows did not slide"
        # diverges right after turn 1's prompt: its windows' rows there were dropped while decoding
        b = a + "and the next one?<|im_end|><|im_start|>"
        reused, _, d2, t2 = run_turn(e, b, steps)
        assert (d2, t2) == fresh(engine_binary, tiny, b, steps), "turn 2 differs from a fresh engine's"
        assert reused == n1, f"turn 2 reused {reused}: the checkpoint at turn 1's end ({n1}) was not restored"
        # continues turn 2's conversation: its last rows are still in the windows
        c = b + t2.decode("utf-8", "replace") + "<|im_end|><|im_start|>"
        reused_c, _, d3, t3 = run_turn(e, c, steps)
        assert (d3, t3) == fresh(engine_binary, tiny, c, steps), "turn 3 differs from a fresh engine's"
        assert reused_c > reused, f"turn 3 reused {reused_c} <= turn 2's {reused}"
        # diverges inside turn 1's prompt, before every window and checkpoint: recomputed from 0
        d = "<|im_start|>user\nThe capital of Spain<|im_end|><|im_start|>"
        reused_d, _, d4, t4 = run_turn(e, d, steps)
        assert reused_d == 0
        assert (d4, t4) == fresh(engine_binary, tiny, d, steps), "turn 4 differs from a fresh engine's"
        e.close(10)
    finally:
        e.kill()


def test_slot_file_carries_the_windows_across_a_restart(tiny, engine_binary, tmp_path):
    """KVSAVE=1: a slot file keeps a windowed layer's last window - 1 rows (and every full layer's)
    and the windows' checkpoint at turn 1's prompt end; after a restart the conversation continues
    from it (reused at least turn 1's prompt) with the tokens and log-probabilities of a fresh
    engine given the whole prompt."""
    steps = 2 * WINDOW
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    a = "<|im_start|>user\nKeep this conversation warm<|im_end|><|im_start|>"
    e1 = Engine(engine_binary, env=base_env(tiny, slots=1, ctx=256, KVSAVE=1, KV_DIR=kv_dir))
    try:
        _, n1, d1, t1 = run_turn(e1, a, steps)
        assert len(d1) > WINDOW
        assert e1.close(10) == 0
    finally:
        e1.kill()
    assert any(kv_dir.iterdir()), "KVSAVE=1 wrote no slot file"
    b = a + t1.decode("utf-8", "replace") + "<|im_end|><|im_start|>"
    e2 = Engine(engine_binary, env=base_env(tiny, slots=1, ctx=256, KVSAVE=1, KV_DIR=kv_dir))
    try:
        reused, _, d2, t2 = run_turn(e2, b, steps)
        e2.close(10)
    finally:
        e2.kill()
    # (the reply's text re-tokenizes differently from the tokens sampled, U+FFFD for split bytes:
    # the prompts part right after turn 1's prompt, where the saved checkpoint sits)
    assert reused >= n1, f"after the restart the slot reused {reused} positions, turn 1's prompt had {n1}"
    assert (d2, t2) == fresh(engine_binary, tiny, b, steps), "the resumed turn differs from a fresh engine's"


@pytest.mark.parametrize("name", ["blk.1.attn_sinks.weight", "blk.0.attn_output.bias", "blk.1.ffn_gate_inp.bias",
                                  "blk.0.ffn_up_exps.bias", "blk.1.ffn_down_exps.bias"])
def test_a_file_without_a_gpt_oss_tensor_is_refused(name, tiny, fwd_dump, tmp_path):
    """Each tensor llama.cpp's openai-moe loader requires: without it, one line naming it."""
    from tests.model.gguf_slice import add_raw, copy_writer, write_out
    dst = tmp_path / "missing.gguf"
    r, w, _ = copy_writer(tiny, dst)
    for t in r.tensors:
        if t.name != name:
            add_raw(w, t)
    write_out(w, dst)
    p = subprocess.run([str(fwd_dump), str(dst), str(tmp_path / "x.f32"), "1", "2"], capture_output=True, text=True)
    assert p.returncode != 0 and f"{name}: tensor missing" in p.stderr, p.stderr


def test_two_slots_decoding_together_match_each_alone(tiny, engine_binary):
    """Rows of two slots in one batch (each slot's windows slide on their own): each turn's tokens
    and log-probabilities are those it gets alone."""
    steps = 3 * WINDOW
    prompts = ["<|im_start|>user\nThe capital of France is<|im_end|><|im_start|>",
               "<|im_start|>user\nList three colours and a number<|im_end|><|im_start|>"]
    e = Engine(engine_binary, env=base_env(tiny, slots=2, ctx=256))
    try:
        rids = [e.submit(p, slot=i, max_tokens=steps, extra=" logprobs=4") for i, p in enumerate(prompts)]
        got = []
        for rid in rids:
            r = e.result(rid, 120)
            assert r.done is not None, r.errors
            got.append(([tuple(parts[2:]) for kind, parts, _ in list(e.events)
                         if kind == "DATA" and int(parts[1]) == rid and len(parts) >= 6], r.text))
        e.close(10)
    finally:
        e.kill()
    for p, g in zip(prompts, got):
        assert len(g[0]) > WINDOW
        assert g == fresh(engine_binary, tiny, p, steps), f"slot of {p!r} differs from its turn alone"
