"""Files of 2026 may hold a layer's routed gate and up experts in one tensor, blk.N.ffn_gate_up_exps
[d_model, 2 x d_expert, E]: each expert's gate rows, then its up rows (llama.cpp's build_moe_ffn
views the two halves of one mul_mat_id). The engine reads the two halves of each expert's slice
as its gate and up (native/src/experts.c stride); the same weights fused or split
(make_arch_fixture.py / make_tiny_qwen35moe.py --fuse-gate-up) give bit-identical logits, EXACT=1
and the int8 default, and the fused file matches the float64 references (which read the halves).
"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from gguf import GGUFReader

from tests.model.gguf_slice import add_raw, copy_writer, write_out
from tests.model.test_arch_oracle import check_against_reference, engine_logits
from tests.model.test_qwen35moe import TOL_EXACT, dump, greedy_reference
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64, 3, 9]


def names(path):
    return {t.name for t in GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("arch,mix", [("qwen3moe", "q4_k_m"), ("glm4moe", "iq4_xs")])
def test_fused_gate_up_equals_the_split_pair(arch, mix, fwd_dump, tmp_path):  # noqa: F811
    split = procs.make_arch_fixture(tmp_path / "split.gguf", arch, "--mix", mix)
    fused = procs.make_arch_fixture(tmp_path / "fused.gguf", arch, "--mix", mix, "--fuse-gate-up")
    have = names(fused)
    assert "blk.1.ffn_gate_up_exps.weight" in have and "blk.1.ffn_gate_exps.weight" not in have, sorted(have)
    for env in ({"EXACT": "1", "KV_TYPE": "f32"}, {}):
        a = engine_logits(fwd_dump, split, PROMPT, -1, tmp_path, **env)
        b = engine_logits(fwd_dump, fused, PROMPT, -1, tmp_path, **env)
        assert np.array_equal(a, b), f"{arch} {mix} {env}: fused gate/up gives other logits than the split pair"
    check_against_reference(fused, arch, f"{arch} {mix} fused gate/up", fwd_dump, tmp_path)


def test_qwen35moe_fused_gate_up(fwd_dump, tmp_path):  # noqa: F811
    split = procs.make_tiny_qwen35moe(tmp_path / "split.gguf")
    fused = procs.make_tiny_qwen35moe(tmp_path / "fused.gguf", "--fuse-gate-up")
    ids, ref_lp = greedy_reference(fused)
    a, b = dump(fwd_dump, split, ids, tmp_path), dump(fwd_dump, fused, ids, tmp_path)
    assert np.array_equal(a, b), "qwen35moe: fused gate/up gives other logits than the split pair"
    lp = a.astype(np.float64)
    lp = lp - lp.max(axis=1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(axis=1, keepdims=True))
    err = max(float(np.abs(ref_lp[p] - lp[p])[np.argsort(-ref_lp[p])[:32]].max()) for p in range(len(ids)))
    print(f"qwen35moe fused gate/up: EXACT=1 max |d log-prob| {err:.2e}")
    assert err <= TOL_EXACT, err


def test_fused_gate_up_of_the_wrong_width_is_refused(fwd_dump, tmp_path):  # noqa: F811
    """A fused tensor must hold 2 x d_expert rows per expert: another width is refused naming it."""
    src = procs.make_arch_fixture(tmp_path / "fused.gguf", "qwen3moe", "--f32", "--fuse-gate-up")
    r, w, _ = copy_writer(src, tmp_path / "bad.gguf")
    for t in r.tensors:
        if t.name == "blk.0.ffn_gate_up_exps.weight":
            w.add_tensor(t.name, np.ascontiguousarray(np.asarray(t.data)[:, :-8, :]))
        else:
            add_raw(w, t)
    bad = write_out(w, tmp_path / "bad.gguf")
    out = subprocess.run([str(fwd_dump), str(bad), str(tmp_path / "x.f32"), "1", "2"], capture_output=True, text=True)
    assert out.returncode != 0 and "blk.0.ffn_gate_up_exps.weight" in out.stderr + out.stdout, out
