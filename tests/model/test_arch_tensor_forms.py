"""The forms converters give qwen2moe's shared-expert gate, blk.N.ffn_gate_inp_shexp.weight.

transformers stores it as a [1, d_model] linear weight; llama.cpp's loader asks for {d_model},
which a [d_model, 1] tensor also satisfies, and llama-quantize never quantizes it (one row: ggml
counts it 1-D), so a file keeps whatever the converter wrote: F32 [d], or a 2-D [d, 1] in the
converter's out type, F16 or BF16. The engine reads each of these as the same vector (EXACT=1 vs
the float64 reference of tests/model/arch_ref.py reading the same values through gguf: greedy
equal, |d log-prob| <= 2e-3, as test_arch_oracle.py) and refuses a quantized one with one line.
Measured (2026-12-01): 12/12 greedy, max |d log-prob| <= 1e-5 for each form.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import quantize

from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.model.gguf_slice import add_raw, copy_writer, write_out
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
STEPS = 12
TOL = 2e-3
GATE = ".ffn_gate_inp_shexp.weight"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = tmp_path_factory.mktemp("forms") / "qwen2moe-f32.gguf"
    procs.make_arch_fixture(path, "qwen2moe", "--f32")
    return path


def rewrite_gate(src, dst, form):
    """src with every shared-expert gate stored as form: f32-2d, f16-2d, bf16-2d or q8_0-2d ([d, 1])."""
    r, w, _ = copy_writer(src, dst)
    for t in r.tensors:
        if not t.name.endswith(GATE):
            add_raw(w, t)
            continue
        row = np.asarray(t.data, dtype=np.float32).reshape(1, -1)        # [1, d]: ne = [d, 1]
        if form == "f32-2d":
            w.add_tensor(t.name, row)
        elif form == "f16-2d":
            w.add_tensor(t.name, row.astype(np.float16))
        else:
            qt = {"bf16-2d": GGMLQuantizationType.BF16, "q8_0-2d": GGMLQuantizationType.Q8_0}[form]
            w.add_tensor(t.name, quantize(row, qt), raw_dtype=qt)
    return write_out(w, dst)


@pytest.mark.parametrize("form", ["f32-2d", "f16-2d", "bf16-2d"])
def test_shared_expert_gate_forms(form, plain, fwd_dump, tmp_path):
    path = rewrite_gate(plain, tmp_path / f"{form}.gguf", form)
    types = {t.tensor_type.name for t in GGUFReader(str(path)).tensors if t.name.endswith(GATE)}
    assert types == {form.split("-")[0].upper()}, types
    ref = REFS["qwen2moe"](str(path))
    for t in ref.w.t:            # the reference's gate as the vector transformers' [1, d] is
        if t.endswith(GATE):
            ref.w.cache[t] = ref.w(t).reshape(-1)
    ids = greedy(ref, PROMPT, STEPS)
    ref_lp = log_softmax(ref.forward(ids))
    out = tmp_path / "logits.f32"
    subprocess.run([str(fwd_dump), str(path), str(out), *map(str, ids)], check=True,
                   env=dict(os.environ, EXACT="1", KV_TYPE="f32"))
    lp = log_softmax(np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64))
    agree, err = 0, 0.0
    for pos in range(len(PROMPT) - 1, len(ids) - 1):
        agree += int(np.argmax(lp[pos]) == ids[pos + 1])
        top = np.argsort(-ref_lp[pos])[:32]
        err = max(err, float(np.abs(ref_lp[pos, top] - lp[pos, top]).max()))
    print(f"{form}: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}")
    assert agree == STEPS and err <= TOL, f"{form}: greedy {agree}/{STEPS}, err {err:.3g}"


def test_quantized_shared_expert_gate_refused(plain, engine_binary, tmp_path):
    path = rewrite_gate(plain, tmp_path / "q8.gguf", "q8_0-2d")
    p = subprocess.run([str(engine_binary), "-m", str(path), "-p", "hi", "-n", "1"], capture_output=True, text=True,
                       timeout=60)
    last = (p.stderr.strip().splitlines() or [""])[-1]
    assert p.returncode == 3 and "blk.0.ffn_gate_inp_shexp.weight: type Q8_0 is not supported" in last, p.stderr[-400:]
