"""Every per-tensor type mix computes what its own dequantized values say (issue 23 item 1).

Files people download mix types inside a layer: the "UD" dynamic quants and anything made with
`llama-quantize --tensor-type` give a layer's ffn_gate_exps and ffn_up_exps different types.
The oracle here needs no reference forward: a file and its F32 copy (every tensor dequantized by
gguf's numpy dequantizers, which the engine's dequant_row matches bit for bit) hold the same
values, so under EXACT=1 (float activations, every weight row dequantized and dotted in one fixed
order whatever its type) the engine must give both the same logits to float tolerance and the
same greedy tokens. The default int8 path gets the loose guard of test_arch_oracle.py (int8
activations on these random models are chaotic; the kernels themselves are pinned bit for bit
by native/tests/test_quant.c, the mixed gate/up job included).

The property: for each architecture, files whose every matrix independently draws its type
(make_arch_fixture.py --random-types, over F32 … IQ4_NL and MXFP4 where the width allows; hypothesis
draws the seed, derandomized so that every run tries the same files); plus the realistic mixes: a
UD-Q2_K_XL-like file, every architecture's experts in MXFP4 (gpt-oss's releases), and
`--tensor-type` overrides that split gate from up.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.model.arch_ref import REFS
from tests.model.gguf_slice import copy_writer, write_out
from tests.support import procs
from tests.support.procs import ROOT

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64, 3, 77]
TOL_LOGIT = 1e-4        # EXACT=1: same values, same float32 order -> rounding-level differences at most
ARCHS = sorted(REFS) + ["llama"]


def dequantized_copy(src, dst):
    """dst: src with every tensor stored as F32 (gguf's dequantizers), every key kept."""
    r, w, _ = copy_writer(src, dst)
    for t in r.tensors:
        qt = GGMLQuantizationType(int(t.tensor_type))
        vals = np.asarray(dequantize(np.asarray(t.data), qt), dtype=np.float32)
        w.add_tensor(t.name, np.ascontiguousarray(vals.reshape([int(x) for x in reversed(t.shape)])))
    return write_out(w, dst)


def tensor_types(path):
    return {t.name: GGMLQuantizationType(int(t.tensor_type)).name for t in GGUFReader(str(path)).tensors}


def logits(fwd_dump, model, ids, tmp_path, **env):
    out = tmp_path / f"{model.stem}.logits"
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True, env=dict(os.environ, **env))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)


def greedy_ids(fwd_dump, model, tmp_path, steps=8):
    """PROMPT + the greedy continuation of model under EXACT=1 (one prefill per step)."""
    ids = list(PROMPT)
    for _ in range(steps):
        ids.append(int(np.argmax(logits(fwd_dump, model, ids, tmp_path, EXACT="1", KV_TYPE="f32")[-1])))
    return ids


def check_against_f32_copy(fwd_dump, model, tmp_path):
    """The mixed file vs its dequantized copy: EXACT logits within TOL_LOGIT and equal greedy
    tokens; the default path finite and near (at most 2 of the steps' choices off)."""
    copy = dequantized_copy(model, tmp_path / f"{model.stem}-f32.gguf")
    ids = greedy_ids(fwd_dump, copy, tmp_path)
    ref = logits(fwd_dump, copy, ids, tmp_path, EXACT="1", KV_TYPE="f32")
    got = logits(fwd_dump, model, ids, tmp_path, EXACT="1", KV_TYPE="f32")
    err = float(np.abs(ref - got).max())
    steps = range(len(PROMPT) - 1, len(ids) - 1)
    assert err <= TOL_LOGIT, f"{model.name}: EXACT logits differ from the F32 copy's by {err:.3g}"
    assert [int(np.argmax(got[p])) for p in steps] == ids[len(PROMPT):], f"{model.name}: greedy tokens differ"
    dflt = logits(fwd_dump, model, ids, tmp_path)
    assert np.isfinite(dflt).all(), f"{model.name}: default-path logits not finite"
    off = sum(int(np.argmax(dflt[p]) != ids[p + 1]) for p in steps)
    assert off <= 2, f"{model.name}: default (int8) path off the F32 copy's greedy choice at {off} of {len(steps)} steps"
    return err


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=3, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_per_tensor_types_match_the_f32_copy(arch, seed, fwd_dump, tmp_path):
    model = tmp_path / f"{arch}-{seed}.gguf"
    procs.make_arch_fixture(model, arch, "--random-types", str(seed))
    types = tensor_types(model)
    assert len({t for n, t in types.items() if n.endswith("_exps.weight")}) > 1, "the draw gave every expert tensor one type"
    check_against_f32_copy(fwd_dump, model, tmp_path)


@pytest.mark.parametrize("arch", ARCHS)
def test_mxfp4_experts_match_the_f32_copy(arch, fwd_dump, tmp_path):
    """Routed experts in MXFP4, the rest Q8_0: how gpt-oss's GGUF releases store them."""
    model = procs.make_arch_fixture(tmp_path / f"{arch}-mxfp4.gguf", arch, "--mix", "q8_0",
                                    "--tensor-type", "_exps\\.weight$=MXFP4")
    types = tensor_types(model)
    exps = {t for n, t in types.items() if n.endswith("_exps.weight")}
    assert exps == {"MXFP4"}, f"expert types {exps}"
    check_against_f32_copy(fwd_dump, model, tmp_path)


IQ_TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]
IQ_STEP_UP = dict(zip(IQ_TYPES, IQ_TYPES[1:] + ["IQ4_XS"]))


@pytest.mark.parametrize("qtype", IQ_TYPES)
def test_iq_experts_match_the_f32_copy(qtype, fwd_dump, tmp_path):
    """Routed gate / up in each IQ type, the downs one step above (the dynamic files' ladder)."""
    down = IQ_STEP_UP[qtype]
    model = procs.make_arch_fixture(tmp_path / f"qwen3moe-{qtype}.gguf", "qwen3moe", "--mix", "q4_k_m",
                                    "--tensor-type", f"ffn_(gate|up)_exps\\.weight$={qtype}",
                                    "--tensor-type", f"ffn_down_exps\\.weight$={down}")
    types = tensor_types(model)
    assert (types["blk.1.ffn_gate_exps.weight"], types["blk.1.ffn_up_exps.weight"],
            types["blk.1.ffn_down_exps.weight"]) == (qtype, qtype, down)
    check_against_f32_copy(fwd_dump, model, tmp_path)


LLCPP_PYTHON = Path(os.environ.get("LLCPP_VENV", "/work/llcpp-venv")) / "bin" / "python"
_spec = importlib.util.spec_from_file_location("llama_child", ROOT / "bench" / "llama_child.py")
assert _spec and _spec.loader
_llama_child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_llama_child)
LLAMA_LOGITS = _llama_child.PRELUDE + """
import sys, json, numpy as np
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_threads=2, n_ctx=64, n_batch=64, logits_all=True, type_k=0, type_v=0, verbose=False)
ids = json.loads(sys.argv[2])
llm.eval(ids)
np.save(sys.argv[3], np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def llama_cpp_logprobs(model, ids, tmp_path):
    """llama.cpp's log-probabilities of every position of ids (one teacher-forced prefill, K/V in F32)."""
    out = tmp_path / f"{model.stem}.llama.npy"
    subprocess.run([str(LLCPP_PYTHON), "-c", LLAMA_LOGITS, str(model), json.dumps(ids), str(out)], check=True,
                   capture_output=True)
    x = np.load(out).astype(np.float64)
    return x - (np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) + x.max(axis=1, keepdims=True))


@pytest.mark.skipif(not LLCPP_PYTHON.exists(), reason="no llama-cpp-python build (set LLCPP_VENV)")
@pytest.mark.parametrize("qtype", IQ_TYPES + ["MXFP4"])
def test_llama_cpp_quantized_iq_experts(qtype, fwd_dump, tmp_path):
    """Experts (MXFP4 too, gpt-oss's) quantized by llama.cpp's own quantizer (ggml_quantize_chunk, a generated importance
    matrix where the type needs one; native/tools/llama_requant.py), the rest F32: EXACT equal to the
    file's F32 copy; llama.cpp on that copy makes our greedy choices, and on the IQ file any choice of
    ours it does not share is a tie within its own activation rounding (the largest log-prob move
    between its two runs: the weights hold the same values)."""
    f32 = procs.make_arch_fixture(tmp_path / "qwen3moe-f32.gguf", "qwen3moe", "--f32")
    model = tmp_path / f"qwen3moe-llama-{qtype}.gguf"
    subprocess.run([str(LLCPP_PYTHON), str(ROOT / "native" / "tools" / "llama_requant.py"), str(f32), str(model),
                    f"ffn_(gate|up)_exps\\.weight$={qtype}", f"ffn_down_exps\\.weight$={IQ_STEP_UP.get(qtype, qtype)}"],
                   check=True)
    assert tensor_types(model)["blk.1.ffn_gate_exps.weight"] == qtype
    check_against_f32_copy(fwd_dump, model, tmp_path)
    copy = tmp_path / f"{model.stem}-f32.gguf"
    ids = greedy_ids(fwd_dump, copy, tmp_path)
    steps = range(len(PROMPT) - 1, len(ids) - 1)
    ref_f32 = llama_cpp_logprobs(copy, ids, tmp_path)
    f32_gaps = [float(ref_f32[p].max() - ref_f32[p, ids[p + 1]]) for p in steps]
    assert max(f32_gaps) < 1e-3, f"{qtype}: llama.cpp on the F32 copy prefers other tokens: {f32_gaps}"
    ref = llama_cpp_logprobs(model, ids, tmp_path)
    # the same weight values: what moves llama.cpp's log-probs between the two files is its own int8
    # (Q8_K) activations for the IQ experts; a choice of ours it does not share must be a tie within that
    noise = float(np.abs(ref - ref_f32)[list(steps)].max())
    gaps = [float(ref[p].max() - ref[p, ids[p + 1]]) for p in steps]
    print(f"{qtype}: llama.cpp's gaps to our choices {max(gaps):.3g}, its activation rounding moves log-probs {noise:.3g}")
    assert max(gaps) <= noise, f"{qtype}: llama.cpp prefers another token by {max(gaps):.3g} > its own noise {noise:.3g}"


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe", "qwen2moe"])
def test_ud_iq2_m_like_mix_matches_the_f32_copy(arch, fwd_dump, tmp_path):
    model = procs.make_arch_fixture(tmp_path / f"{arch}-ud-iq2.gguf", arch, "--mix", "ud_iq2_m")
    types = tensor_types(model)
    moe = sorted(int(n.split(".")[1]) for n in types if n.endswith("ffn_gate_exps.weight"))
    for layer in moe:       # even layers IQ2_XXS gate / IQ2_XS up, odd ones the other way; downs a step up
        gate, up, down = (types[f"blk.{layer}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down"))
        assert (gate, up, down) == (("IQ2_XXS", "IQ2_XS", "IQ2_S") if layer % 2 == 0 else ("IQ2_XS", "IQ2_XXS", "IQ2_XS"))
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q6_K"
    check_against_f32_copy(fwd_dump, model, tmp_path)


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe", "qwen2moe"])
def test_ud_q2_k_xl_like_mix_matches_the_f32_copy(arch, fwd_dump, tmp_path):
    model = procs.make_arch_fixture(tmp_path / f"{arch}-ud.gguf", arch, "--mix", "ud_q2_k_xl")
    types = tensor_types(model)
    moe = sorted(int(n.split(".")[1]) for n in types if n.endswith("ffn_gate_exps.weight"))
    for layer in moe:       # even layers Q2_K gate / Q3_K up, odd ones the other way; downs a step up
        gate, up, down = (types[f"blk.{layer}.ffn_{k}_exps.weight"] for k in ("gate", "up", "down"))
        assert (gate, up, down) == (("Q2_K", "Q3_K", "Q4_K") if layer % 2 == 0 else ("Q3_K", "Q2_K", "Q3_K"))
    assert types["output.weight"] == "Q6_K" and types["blk.0.attn_v.weight"] == "Q6_K"
    check_against_f32_copy(fwd_dump, model, tmp_path)


# the three failing cases: K gate beside another K up, and a quantized gate beside an F32 up
OVERRIDES = [("Q4_K", "Q3_K"), ("Q2_K", "Q4_K"), ("Q4_K", "F32"), ("F16", "Q6_K")]


@pytest.mark.parametrize("gate,up", OVERRIDES, ids=[f"{g}-{u}" for g, u in OVERRIDES])
def test_tensor_type_overrides_split_gate_from_up(gate, up, fwd_dump, tmp_path):
    model = procs.make_arch_fixture(tmp_path / f"qwen3moe-{gate}-{up}.gguf", "qwen3moe", "--mix", "q4_k_m",
                                    "--tensor-type", f"ffn_gate_exps={gate}", "--tensor-type", f"ffn_up_exps={up}")
    types = tensor_types(model)
    assert (types["blk.1.ffn_gate_exps.weight"], types["blk.1.ffn_up_exps.weight"]) == (gate, up)
    check_against_f32_copy(fwd_dump, model, tmp_path)


def test_dense_and_shared_gate_up_of_different_types(fwd_dump, tmp_path):
    """GLM's leading dense FFN and qwen2moe's shared expert run the same fused gate/up job."""
    for arch, pats in (("glm4moe", ("ffn_gate\\.weight=Q5_K", "ffn_up\\.weight=Q8_0")),
                       ("qwen2moe", ("ffn_gate_shexp=Q3_K", "ffn_up_shexp=BF16"))):
        args = [x for p in pats for x in ("--tensor-type", p)]
        model = procs.make_arch_fixture(tmp_path / f"{arch}-dense-mixed.gguf", arch, *args)
        check_against_f32_copy(fwd_dump, model, tmp_path)
