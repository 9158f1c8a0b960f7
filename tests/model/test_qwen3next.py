"""qwen3next (Qwen3-Next-80B-A3B, the Gated DeltaNet / gated attention hybrid that qwen35moe
descends from): the tiny files of native/tools/make_tiny_qwen3next.py through the engine against
tests/model/qwen35_ref.py's float64 Qwen3Next forward, in EXACT mode (float activations, F32 K/V):
  - one prefill of a prompt + the reference's greedy continuation: same greedy choices, max
    |d log-prob| over the top 32 <= 2e-3, for the converter's attn_qkv + attn_gate form, the
    legacy fused ssm_in form and a Q8_0 file;
  - the two forms are one model: bit-identical logits, EXACT and default;
  - the same ids in two chunks (the recurrent state carried between forwards) and one token at a
    time: bit-identical logits to one pass;
  - the MTP block (FWD_DUMP_MTP): its logits against the reference's llama.cpp graph_mtp;
  - serve mode, one slot, two turns: the second turn resumes the slot's state (reused > 0: its
    live state or the checkpoint before turn 1's last prompt token) and answers as a fresh prefill
    on another slot;
  - a file without a key or tensor the architecture needs is refused naming it.
The per-slot state and checkpoints are the code qwen35moe's tests cover (gdn.c, rstate.c).
llama.cpp agreement (a one-off, bench/arch_crosscheck.py --arch qwen3next): see native/README.md.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from tests.model.arch_ref import agreement, log_softmax
from tests.model.qwen35_ref import Qwen3Next
from tests.native.engine import Engine, base_env, chatml
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
STEPS = 8
TOL_EXACT = 2e-3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The default tiny file (attn_qkv + attn_gate, an MTP block), the same model with the legacy
    ssm_in, and a Q8_0 one (the reference reads it through gguf's dequantizer)."""
    d = tmp_path_factory.mktemp("q3n")
    return {"f32": procs.make_tiny_qwen3next(d / "f32.gguf"),
            "legacy_ssm_in": procs.make_tiny_qwen3next(d / "legacy.gguf", "--legacy-ssm-in"),
            "q8_0": procs.make_tiny_qwen3next(d / "q8.gguf", "--q8", "--no-mtp")}


@pytest.fixture(scope="module")
def reference(files):
    return greedy_reference(files["f32"])


def greedy_reference(path):
    ref = Qwen3Next(str(path))
    ids = list(PROMPT)
    state: dict = {}
    lg = ref.forward(ids, state)            # incremental greedy: the reference's own state carried
    for _ in range(STEPS):
        t = int(np.argmax(lg[-1]))
        lg = ref.forward([t], state, len(ids))
        ids.append(t)
    return ids, log_softmax(ref.forward(ids))


def dump(fwd_dump, model, ids, tmp_path, exact=True, **env):
    out = tmp_path / "logits.f32"
    mode = {"EXACT": "1", "KV_TYPE": "f32"} if exact else {}
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True, capture_output=True,
                   env=dict(os.environ, **mode, **env))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


@pytest.mark.parametrize("variant", ["f32", "legacy_ssm_in", "q8_0"])
def test_exact_against_reference(fwd_dump, files, variant, tmp_path):
    ids, ref = greedy_reference(files[variant])
    eng = log_softmax(dump(fwd_dump, files[variant], ids, tmp_path).astype(np.float64))
    agree, err = agreement(eng, ref, ids, len(PROMPT) - 1)
    print(f"qwen3next {variant} EXACT=1: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}")
    assert agree == STEPS, f"{variant}: greedy choice differs from the reference at {STEPS - agree} steps"
    assert err <= TOL_EXACT, f"{variant}: log-prob error {err:.3g} > {TOL_EXACT}"


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
def test_legacy_ssm_in_is_the_same_model(fwd_dump, files, reference, tmp_path, exact):
    ids, _ = reference
    a = dump(fwd_dump, files["f32"], ids, tmp_path, exact)
    b = dump(fwd_dump, files["legacy_ssm_in"], ids, tmp_path, exact)
    assert np.array_equal(a, b), f"ssm_in gives other logits than attn_qkv + attn_gate (max {np.abs(a - b).max():.3g})"


@pytest.mark.parametrize("how", [{"FWD_DUMP_SPLIT": "4"}, {"FWD_DUMP_SERIAL": "1"}], ids=["split4", "serial"])
@pytest.mark.parametrize("variant", ["f32", "legacy_ssm_in"])
def test_chunks_equal_one_pass(fwd_dump, files, reference, tmp_path, how, variant):
    ids, _ = reference
    one = dump(fwd_dump, files[variant], ids, tmp_path)
    parts = dump(fwd_dump, files[variant], ids, tmp_path, **how)
    assert np.array_equal(one, parts), f"{how}: logits differ from one pass (max {np.abs(one - parts).max():.3g})"


def test_mtp_block_against_reference(fwd_dump, files, tmp_path):
    """The block's logits at every position (the trunk's output_norm'ed state, the next token;
    the last reads `nxt`), as the reference's graph_mtp."""
    nxt = 211
    dump(fwd_dump, files["f32"], PROMPT, tmp_path, FWD_DUMP_MTP=str(nxt))
    eng = log_softmax(np.fromfile(tmp_path / "logits.f32.mtp", dtype=np.float32)
                      .reshape(len(PROMPT), -1).astype(np.float64))
    ref_m = Qwen3Next(str(files["f32"]))
    _, hn = ref_m.forward_h(PROMPT)
    ref = log_softmax(ref_m.mtp(hn, PROMPT[1:] + [nxt], 0, {})[0])
    err = max(float(np.abs(ref[p, np.argsort(-ref[p])[:32]] - eng[p, np.argsort(-ref[p])[:32]]).max())
              for p in range(len(PROMPT)))
    print(f"qwen3next MTP EXACT=1: max |d log-prob| {err:.2e}")
    assert (eng.argmax(1) == ref.argmax(1)).all() and err <= TOL_EXACT, err


def test_turns_on_one_slot(engine_binary, files):
    e = Engine(engine_binary, env=base_env(files["f32"], slots=2, ctx=512))
    try:
        p1 = chatml("Hello there, how are you?").encode()
        r1 = e.generate(p1, slot=0, max_tokens=6)
        p2 = p1 + r1.text + b"<|im_end|>\n" + chatml("And then?").encode()
        r2 = e.generate(p2, slot=0, max_tokens=6)
        # the live state, or (when the random reply's bytes re-tokenize otherwise) the checkpoint
        # turn 1's prefill kept before its prompt's last token
        assert r2.reused is not None and r2.reused >= r1.prompt_tokens - 1, (
            f"the extending turn did not resume the slot's state: reused={r2.reused}, first prompt {r1.prompt_tokens}")
        fresh = e.generate(p2, slot=1, max_tokens=6)
        assert fresh.reused == 0 and fresh.text == r2.text, "resumed turn differs from a fresh prefill"
    finally:
        try:
            e.close(10)
        finally:
            e.kill()


@pytest.mark.parametrize("args,named", [
    (["--interval", "0"], "qwen3next.full_attention_interval"),
    (["--omit-key", "ssm.group_count"], "qwen3next.ssm.group_count"),
    (["--omit-tensor", "blk.1.ssm_ba.weight"], "blk.1.ssm_ba.weight"),
    (["--omit-tensor", "blk.0.attn_qkv.weight"], "blk.0.attn_qkv.weight"),
    (["--omit-tensor", "blk.3.ffn_gate_shexp.weight"], "blk.3.ffn_gate_shexp.weight"),
], ids=["interval", "ssm_key", "ssm_ba", "qkv", "shexp"])
def test_refused_naming_what_is_missing(fwd_dump, tmp_path, args, named):
    path = procs.make_tiny_qwen3next(tmp_path / "bad.gguf", "--no-mtp", *args)
    r = subprocess.run([str(fwd_dump), str(path), str(tmp_path / "x.f32"), "5"], capture_output=True, text=True)
    assert r.returncode != 0 and named in r.stderr, r.stderr
