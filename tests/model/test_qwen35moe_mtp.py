"""qwen35moe's MTP block as a draft head (native/src/mtp.c, gdn.c's hybrid_mtp_forward), in
EXACT mode against tests/model/qwen35_ref.py's float64 MTP (llama.cpp's graph_mtp):
  - the block's logits at every position of a prompt (the trunk's output_norm'ed state and the
    token after it), on the F32 and Q8_0 tiny files: max |d log-prob| over the top 32 <= 2e-3 and
    the same greedy token;
  - a chain of three guesses after a given next token (each guess's row reads the block's own
    state), the same tokens as the reference's chain;
  - in serve mode, drafting with the block changes nothing the engine emits (two turns on one
    slot, the second resuming the slot cut back by verify batches), its SPEC line counts the
    drafts; the adaptive policy stops drafting guesses that a random head never gets right;
  - SPEC_DRAFT without SPEC_REPLAY on a file without an MTP block is refused before READY.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from tests.model.arch_ref import log_softmax
from tests.model.qwen35_ref import Qwen35Moe
from tests.native.engine import Engine, base_env, two_turns
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64, 3, 77]
NEXT = 211
TOL_EXACT = 2e-3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("q35mtp")
    return {"f32": procs.make_tiny_qwen35moe(d / "f32.gguf"),
            "q8_0": procs.make_tiny_qwen35moe(d / "q8.gguf", "--q8"),
            "no_mtp": procs.make_tiny_qwen35moe(d / "nomtp.gguf", "--no-mtp")}


def reference(path, ids, nxt, k):
    """The block's logits at every position of ids (the last reading nxt) and its chain of k
    greedy guesses after nxt."""
    ref = Qwen35Moe(str(path))
    _, hn = ref.forward_h(ids)
    cache: dict = {}
    lg, out = ref.mtp(hn, ids[1:] + [nxt], 0, cache)
    drafts, h, logits = [], out[-1:], lg
    for i in range(k):
        drafts.append(int(np.argmax(logits[-1])))
        if i + 1 < k:
            logits, h = ref.mtp(h, [drafts[-1]], len(ids) + i, cache)
    return lg, drafts


@pytest.mark.parametrize("variant", ["f32", "q8_0"])
def test_mtp_block_against_reference(fwd_dump, files, variant, tmp_path):
    out = tmp_path / "logits.f32"
    r = subprocess.run([str(fwd_dump), str(files[variant]), str(out), *map(str, PROMPT)], check=True,
                       capture_output=True, text=True,
                       env=dict(os.environ, EXACT="1", KV_TYPE="f32", FWD_DUMP_MTP=str(NEXT), FWD_DUMP_DRAFT="3"))
    eng = log_softmax(np.fromfile(str(out) + ".mtp", dtype=np.float32).reshape(len(PROMPT), -1).astype(np.float64))
    ref_lg, ref_drafts = reference(files[variant], PROMPT, NEXT, 3)
    ref = log_softmax(ref_lg)
    err = 0.0
    for pos in range(len(PROMPT)):
        assert np.argmax(eng[pos]) == np.argmax(ref[pos]), f"{variant}: the block's greedy token differs at {pos}"
        top = np.argsort(-ref[pos])[:32]
        err = max(err, float(np.abs(ref[pos, top] - eng[pos, top]).max()))
    print(f"qwen35moe MTP {variant} EXACT=1: max |d log-prob| {err:.2e}, drafts {r.stdout.strip()} / {ref_drafts}")
    assert err <= TOL_EXACT, f"{variant}: the block's log-prob error {err:.3g} > {TOL_EXACT}"
    assert [int(t) for t in r.stdout.split()] == ref_drafts, "the chain of guesses differs from the reference's"


def spec_fields(req) -> list[int]:
    line = req.block_line("SPEC")
    assert line is not None, "no SPEC line at the end of a drafting turn"
    f = line.split()
    return [int(f[2]), int(f[3]), int(f[4]), int(f[11])]    # steps, drafted, accepted, lone guesses


def test_drafting_with_the_block_emits_the_plain_tokens(engine_binary, files):
    plain, (p1, p2) = two_turns(engine_binary, files["f32"], 24)
    texts, (r1, r2) = two_turns(engine_binary, files["f32"], 24, SPEC_DRAFT=3, SPEC_POLICY="always")
    assert texts == plain, "drafting with the MTP block changed the greedy output"
    assert r2.reused == p2.reused > 0, (r2.reused, p2.reused)
    for r in (r1, r2):
        steps, drafted, accepted, _ = spec_fields(r)
        assert steps > 0 and drafted >= steps and 0 <= accepted <= drafted, (steps, drafted, accepted)
    # adaptive: the head is random, so its lone guesses are wrong and it pauses instead of drafting
    texts, (a1, a2) = two_turns(engine_binary, files["f32"], 24, SPEC_DRAFT=3)
    assert texts == plain
    for r in (a1, a2):
        steps, drafted, accepted, guesses = spec_fields(r)
        assert guesses >= 1 and steps <= 2, (steps, drafted, accepted, guesses)


def test_drafting_needs_a_block(engine_binary, files):
    e = Engine(engine_binary, env=base_env(files["no_mtp"], slots=1, SPEC_DRAFT=2), wait_ready=False)
    try:
        assert e.wait_exit(60) == 2
        assert "has no MTP block" in e.stderr_text(), e.stderr_text()[-400:]
    finally:
        e.kill()
