"""qwen3moe at the head and expert ratios of the real files: Qwen3-30B-A3B has 32 query heads per
4 KV heads (8 per KV head, twice the attention kernels' ATT_G = 4 heads per pass) and routes 8 of
128 experts; GLM-4.5-Air has 12 per KV head. The fixtures of test_arch_oracle.py have 2 per KV head
and top-2 of 8, so the kernels' passes over a KV head's query heads (4 + 4, 4 + 2) and a wide
top-k were untested. Here: make_arch_fixture.py's qwen3moe layout with 16 heads / 2 KV heads
(8 per KV head) and 12 / 2 (6 = 4 + 2), head_dim 128, 64 experts, top-8, K-quant mix; the engine
in EXACT=1 (KV f32) against the float64 reference (greedy equal, |d log-prob| <= 2e-3, the
oracle's bar), and one-token-at-a-time prefill (FWD_DUMP_SERIAL=1) bit-identical to the batched
one, in both K/V types. Measured (2026-12-01): 12/12 greedy, max |d log-prob| <= 1e-5.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess

import numpy as np
import pytest

from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.support.procs import ROOT

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
STEPS = 12
TOL = 2e-3
SHAPES = {"heads16-kv2": dict(n_heads=16, n_kv=2), "heads12-kv2": dict(n_heads=12, n_kv=2)}


def make(path, **shape):
    """The generator's qwen3moe layout and mix with these shape fields changed (in-process)."""
    spec = importlib.util.spec_from_file_location("make_arch_fixture_shapes", ROOT / "native" / "tools" /
                                                  "make_arch_fixture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ARCHS["qwen3moe"] = dict(mod.ARCHS["qwen3moe"], experts=64, top_k=8, **shape)
    assert mod.main([str(path), "--arch", "qwen3moe"]) in (0, None)
    return path


def logits(fwd_dump, model, ids, **env):
    out = model.with_suffix(".f32")
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True, env=dict(os.environ, **env))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_qwen3moe_real_ratios(name, fwd_dump, tmp_path):
    path = make(tmp_path / f"{name}.gguf", **SHAPES[name])
    ref = REFS["qwen3moe"](str(path))
    assert (ref.H, ref.KVH, ref.top_k) == (SHAPES[name]["n_heads"], SHAPES[name]["n_kv"], 8)
    ids = greedy(ref, PROMPT, STEPS)
    ref_lp = log_softmax(ref.forward(ids))
    eng = logits(fwd_dump, path, ids, EXACT="1", KV_TYPE="f32")
    lp = log_softmax(eng.astype(np.float64))
    agree, err = 0, 0.0
    for pos in range(len(PROMPT) - 1, len(ids) - 1):
        agree += int(np.argmax(lp[pos]) == ids[pos + 1])
        top = np.argsort(-ref_lp[pos])[:32]
        err = max(err, float(np.abs(ref_lp[pos, top] - lp[pos, top]).max()))
    print(f"{name}: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}")
    assert agree == STEPS and err <= TOL, f"{name}: greedy {agree}/{STEPS}, err {err:.3g}"
    # the same bits one token at a time (other attention blocks, other passes over the heads)
    assert np.array_equal(eng, logits(fwd_dump, path, ids, EXACT="1", KV_TYPE="f32", FWD_DUMP_SERIAL="1"))
    for kv in ("f16", "f32"):      # and on the default int8 path
        assert np.array_equal(logits(fwd_dump, path, ids, KV_TYPE=kv),
                              logits(fwd_dump, path, ids, KV_TYPE=kv, FWD_DUMP_SERIAL="1")), kv
