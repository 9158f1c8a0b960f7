"""Routing details of 2026 files, each passed to the MoE at the call (native/src/model_impl.h
moe_opts): the selection bias blk.N.exp_probs_b.bias (it chooses the experts, the weights stay
unbiased) and grouped top-k (<arch>.expert_group_count / expert_group_used_count: only the best
groups' experts compete, a group's score the sum of its two best), on glm4moe (sigmoid gating)
and on qwen3moe (softmax gating: llama.cpp applies groups to any architecture).

Each file is a make_arch_fixture.py F32 fixture rewritten so that the detail changes the choices
(a bias of 0.5 on a third of the experts; 4 groups of 2 experts); the engine (EXACT=1) matches the
float64 reference (tests/model/arch_ref.py) that applies it, and the same file without the detail
gives other logits, so the match is not one the detail could pass without being applied.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.model.gguf_slice import add_raw, copy_writer, write_out
from tests.model.test_arch_oracle import PROMPT, STEPS, TOL_EXACT, check_against_reference, compare, engine_logits
from tests.support import procs

EXACT = {"EXACT": "1", "KV_TYPE": "f32"}


def rewrite(src, dst, keys=None, new_keys=None, bias=None):
    """src with keys' values replaced, new_keys (uint32) added and every exp_probs_b.bias set to bias."""
    r, w, _ = copy_writer(src, dst, keys)
    for k, v in (new_keys or {}).items():
        w.add_uint32(k, v)
    for t in r.tensors:
        if bias is not None and t.name.endswith("exp_probs_b.bias"):
            w.add_tensor(t.name, bias.astype(np.float32))
        else:
            add_raw(w, t)
    return write_out(w, dst)


def strong_bias(n):
    return np.where(np.arange(n) % 3 == 0, 0.5, 0.0)


def test_selection_bias_chooses_experts_and_does_not_weigh_them(fwd_dump, tmp_path):  # noqa: F811
    base = procs.make_arch_fixture(tmp_path / "glm.gguf", "glm4moe", "--f32")
    biased = rewrite(base, tmp_path / "biased.gguf", bias=strong_bias(8))
    unbiased = rewrite(base, tmp_path / "unbiased.gguf", bias=np.zeros(8))
    check_against_reference(biased, "glm4moe", "glm4moe exp_probs_b 0.5 on experts 0, 3, 6", fwd_dump, tmp_path)
    ids = PROMPT + [1, 2, 3, 4]
    a = engine_logits(fwd_dump, biased, ids, -1, tmp_path, **EXACT)
    b = engine_logits(fwd_dump, unbiased, ids, -1, tmp_path, **EXACT)
    assert np.abs(a - b).max() > 1e-2, "the selection bias changed no choice: the test proves nothing"

    class WeighedByBias(REFS["glm4moe"]):   # the trap: the bias in the mixing weights too
        def route(self, l, lg):
            sel, _ = super().route(l, lg)
            wts = 1.0 / (1.0 + np.exp(-lg[sel])) + self.w(f"blk.{l}.exp_probs_b.bias")[sel]
            return sel, wts / wts.sum() * float(self.key("expert_weights_scale", 1.0))

    wrong = WeighedByBias(str(biased))
    wids = greedy(wrong, PROMPT, STEPS)
    eng = log_softmax(engine_logits(fwd_dump, biased, wids, -1, tmp_path, **EXACT))
    agree, steps, err = compare(log_softmax(wrong.forward(wids)), eng, len(PROMPT), wids)
    assert err > 10 * TOL_EXACT, f"the engine matches a reference that weighs by the bias too ({err:.2e})"


GROUPED = [("glm4moe", {"glm4moe.expert_group_count": 4, "glm4moe.expert_group_used_count": 2}, None),
           ("qwen3moe", None, {"qwen3moe.expert_group_count": 4, "qwen3moe.expert_group_used_count": 1})]


@pytest.mark.parametrize("arch,keys,new_keys", GROUPED, ids=[g[0] for g in GROUPED])
def test_grouped_top_k(arch, keys, new_keys, fwd_dump, tmp_path):  # noqa: F811
    base = procs.make_arch_fixture(tmp_path / "base.gguf", arch, "--f32")
    grouped = rewrite(base, tmp_path / "grouped.gguf", keys, new_keys,
                      bias=strong_bias(8) if arch == "glm4moe" else None)
    ungrouped = rewrite(base, tmp_path / "ungrouped.gguf",
                        {f"{arch}.expert_group_count": 1} if keys else None, None,
                        bias=strong_bias(8) if arch == "glm4moe" else None)
    check_against_reference(grouped, arch, f"{arch} grouped top-k {keys or new_keys}", fwd_dump, tmp_path)
    ids = PROMPT + [1, 2, 3, 4]
    a = engine_logits(fwd_dump, grouped, ids, -1, tmp_path, **EXACT)
    b = engine_logits(fwd_dump, ungrouped, ids, -1, tmp_path, **EXACT)
    assert np.abs(a - b).max() > 1e-2, "the groups changed no choice: the test proves nothing"


def test_invalid_groups_are_refused(fwd_dump, tmp_path):  # noqa: F811
    import subprocess
    base = procs.make_arch_fixture(tmp_path / "base.gguf", "qwen3moe", "--f32")
    bad = rewrite(base, tmp_path / "bad.gguf", None, {"qwen3moe.expert_group_count": 3,
                                                     "qwen3moe.expert_group_used_count": 1})
    out = subprocess.run([str(fwd_dump), str(bad), str(tmp_path / "x.f32"), "1"], capture_output=True, text=True)
    assert out.returncode != 0 and "qwen3moe.expert_group_count 3" in out.stderr, out.stderr
