#!/usr/bin/env python3
"""llama.cpp cross-check of the architecture fixtures (issue 15 item 3; a benchmark-side check,
not a test): each fixture of native/tools/make_arch_fixture.py, in its K-quant mix and as --f32,
runs through llama.cpp (llama-cpp-python built from source) and through our engine
(native/build/fwd_dump) on the same token ids, and the script prints one table row per
(architecture, mix): greedy agreement and the largest log-probability difference.

    bench/arch_crosscheck.py [--llama-python bench/.venv-llama/bin/python] [--arch NAME ...]
                             [--steps 24] [--threads 2] [--llama-quantize Q4_K_M Q8_0 ...]
                             [--d-expert 1408] [--shape n_heads=16,n_kv=2,experts=64,top_k=8]
                             [--rope-scaling yarn:4:64 | linear:2] [--no-mtp] [--interval N]
                             [--legacy-ssm-in]

--arch qwen35moe (not in the default list: it needs llama-cpp-python 0.3.36 or later) runs
native/tools/make_tiny_qwen35moe.py's F32 file and its Q8_0-matrices one (`q8`; --no-mtp,
--interval and --shape go to that generator), with tests/model/qwen35_ref.py's float64 forward as
its reference. On the Q8_0 file llama.cpp's CPU matmuls quantize activations to Q8_0 rows, so its
distance to the float64 reference is its own rounding (our default int8 path is the like-for-like
row); the stderr line's "reference vs ours EXACT=1" is then the figure to read.
--arch qwen3next likewise runs make_tiny_qwen35moe.py --arch qwen3next's F32 and Q8_0 files (the same
options, and --legacy-ssm-in: the DeltaNet input as the older files' fused ssm_in) against
tests/model/qwen35_ref.py's Qwen3Next.

--llama-quantize also runs the F32 fixture quantized by llama.cpp's own llama_model_quantize to
those file types: the per-tensor type choices of the files people download (Q6_K head and some
expert downs, Q8_0 attention k/v of MoE files, Q5_K attention output, the K-quant fallbacks Q5_0 /
Q5_1 / Q8_0 / IQ4_NL for rows that are not a multiple of 256); a file our engine refuses gets its
refusal line in the table. --d-expert changes the fixtures' expert width (e.g. 1408, Qwen1.5-MoE-
A2.7B's and GLM-4.5-Air's); --shape changes any integer field of the generator's ARCHS entry
(heads per KV head, experts, top-k) or one of its extra keys; --rope-scaling adds <arch>.rope.scaling.* keys to every file
(type:factor[:original_context_length], as tests/model/test_arch_rope_scaling.py does, or any keys
as k=v,...: the edge cases of the README were checked that way).

Method: llama.cpp decodes STEPS greedy tokens after a fixed 10-token prompt (its own choices);
then both engines score that whole sequence teacher-forced (one prefill each: llama.cpp with
logits for every position and its K/V cache in F32, ours with fwd_dump). Per continuation step:
does our argmax equal llama.cpp's (where not: llama.cpp's log-prob margin of its choice over ours,
the "worst gap"), and max |log p_ours - log p_llama| over llama.cpp's top 32 tokens. Ours runs
twice: EXACT=1 with KV_TYPE=f32 (float activations; K/V as llama.cpp's here) and the default
(int8 activations, fp16 K/V).

llama.cpp's CPU matmuls quantize activations for quantized weights (Q8_K rows for K-quants), so
on the K-quant mix a difference of the order of our own int8 path's is expected; with --f32
weights both sides compute in float32 and must agree to float rounding. The last columns score
tests/model/arch_ref.py's float64 forward (the oracle of test_arch_oracle.py) against llama.cpp
the same way: equal figures there mean the K-quant-mix difference is llama.cpp's own activation
rounding. And every K-quant tensor of the fixture goes through llama.cpp's dequantizer
(libggml-base's dequantize_row_*, via ctypes) and gguf's numpy one: bit-identical values mean
llama.cpp reads the fixtures' blocks exactly as our engine and the oracle do.

llama.cpp's model parameter use_extra_bufts is set to False (its AMX / repacked CPU buffers
fault with SIGILL on some of these VMs).
Setup (once, ~10 min on 2 cores):
    python3 -m venv bench/.venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=ON" bench/.venv-llama/bin/pip install llama-cpp-python==0.3.16
(0.3.36 runs this script unchanged and has grouped expert selection, expert_group_count /
expert_group_used_count, which 0.3.16 lacks: glm4moe's fixture as generated, with 2 groups, needs it.)
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.model.arch_ref import REFS as ARCH_REFS  # noqa: E402  (float64 forwards from the published definitions)
from tests.model.qwen35_ref import Qwen35Moe, Qwen3Next  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
import llama_child  # noqa: E402  (the llama.cpp child scripts' prelude: use_extra_bufts off)
GEN = ROOT / "native" / "tools" / "make_arch_fixture.py"
GPTOSS_GEN = ROOT / "native" / "tools" / "make_tiny_gptoss.py"   # gpt-oss: its own generator
GPTOSS_MIXES = {"kquant": "q4_k_m", "f32": "f32", "mxfp4": "mxfp4"}
QWEN35_GEN = ROOT / "native" / "tools" / "make_tiny_qwen35moe.py"   # the hybrids' own generator (--arch)
QWEN35_MIXES = {"f32": [], "q8": ["--q8"]}
FWD_DUMP = ROOT / "native" / "build" / "fwd_dump"
PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
TOPN = 32
REFS = {**ARCH_REFS, "qwen35moe": Qwen35Moe, "qwen3next": Qwen3Next}

LLAMA_SCRIPT = llama_child.PRELUDE + textwrap.dedent("""
    import json, sys
    import numpy as np
    from llama_cpp import Llama
    model, threads, steps, prompt, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=256, n_batch=256,
                logits_all=True, type_k=0, type_v=0, verbose=True)   # K/V cache in F32
    # greedy continuation, one token at a time
    llm.reset()
    llm.eval(prompt)
    ids = list(prompt)
    for _ in range(steps):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ids.append(t)
        llm.eval([t])
    # the whole sequence teacher-forced in one prefill
    llm.reset()
    llm.eval(ids)
    np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
    print(json.dumps({"ids": ids, "n_vocab": llm.n_vocab(), "extra_bufts_off": hasattr(_default(), "use_extra_bufts")}))
""")


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


class Refused(Exception):
    pass


def ours(model, ids, vocab, tmp, **env):
    out = Path(tmp) / "ours.f32"
    r = subprocess.run([str(FWD_DUMP), str(model), str(out), *map(str, ids)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), **env))
    if r.returncode != 0:
        raise Refused((r.stderr.strip().splitlines() or ["?"])[-1].replace("fwd_dump: ", ""))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), vocab)


QUANT_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    import llama_cpp
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = int(sys.argv[3])
    p.nthread = 2
    sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
""")
# llama.cpp's llama_ftype values of the file types people download
FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15,
          "Q5_K_M": 17, "Q6_K": 18, "IQ4_XS": 30}


def type_census(model):
    from collections import Counter

    from gguf import GGUFReader
    c = Counter(t.tensor_type.name for t in GGUFReader(str(model)).tensors)
    return " ".join(f"{k} {v}" for k, v in sorted(c.items()))


def compare(ref_lp, lp, n_prompt):
    """(steps, our argmax == llama.cpp's argmax count, max |d log-prob| over llama.cpp's top 32,
    worst gap: the largest llama.cpp log-prob margin of its choice over ours where they differ)."""
    agree, err, gap = 0, 0.0, 0.0
    steps = ref_lp.shape[0] - n_prompt
    for pos in range(n_prompt - 1, ref_lp.shape[0] - 1):
        mine = int(np.argmax(lp[pos]))
        agree += int(mine == np.argmax(ref_lp[pos]))
        gap = max(gap, float(ref_lp[pos].max() - ref_lp[pos, mine]))
        top = np.argsort(-ref_lp[pos])[:TOPN]
        err = max(err, float(np.abs(ref_lp[pos, top] - lp[pos, top]).max()))
    return steps, agree, err, gap


def ggml_dequant_check(model, llama_python):
    """Every quantized tensor of model through llama.cpp's own dequantizer (libggml-base's
    dequantize_row_<type>, via ctypes) against gguf's numpy dequantizer (the one our oracle and
    our engine's dequant_row match bit for bit): (tensors compared, tensors not bit-identical)."""
    import ctypes
    import glob

    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize
    site = subprocess.run([llama_python, "-c", "import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    lib = ctypes.CDLL(glob.glob(os.path.join(site, "lib", "libggml-base.so"))[0])
    n = bad = 0
    for t in GGUFReader(str(model)).tensors:
        qt = GGMLQuantizationType(int(t.tensor_type))
        if qt.name in ("F32", "F16", "BF16"):
            continue
        fn = getattr(lib, f"dequantize_row_{qt.name.lower()[:-2]}_K" if qt.name.endswith("_K")
                     else f"dequantize_row_{qt.name.lower()}")
        raw = np.ascontiguousarray(np.asarray(t.data)).view(np.uint8)
        k = int(np.prod([int(x) for x in t.shape]))
        out = np.empty(k, dtype=np.float32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        fn(raw.ctypes.data, out.ctypes.data, k)
        mine = dequantize(np.asarray(t.data), qt).astype(np.float32).reshape(-1)
        n += 1
        bad += int(not np.array_equal(out.view(np.uint32), mine.view(np.uint32)))
    return n, bad


def qwen35_options(a, arch):
    """The qwen35moe / qwen3next generator's options the command line gives (its --shape is the same
    K=V list)."""
    return ((["--no-mtp"] if a.no_mtp else []) + (["--interval", str(a.interval)] if a.interval is not None else [])
            + (["--shape", a.shape] if a.shape else [])
            + (["--legacy-ssm-in"] if arch == "qwen3next" and a.legacy_ssm_in else []))


def main():
    spec = importlib.util.spec_from_file_location("make_arch_fixture", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", default=str(ROOT / "bench" / ".venv-llama" / "bin" / "python"))
    ap.add_argument("--arch", nargs="*", default=sorted(mod.ARCHS),
                    help="architectures (default: the generator's); gpt-oss runs make_tiny_gptoss.py's F32, "
                         "Q4_K_M-like and MXFP4-experts files")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--llama-quantize", nargs="*", default=[], choices=sorted(FTYPES), metavar="FTYPE",
                    help="also the F32 fixture quantized by llama.cpp's own llama_model_quantize to these file "
                         "types (its per-tensor rules: Q6_K heads, Q8_0 attention of MoE files, K-quant fallbacks)")
    ap.add_argument("--shape", help="comma-separated field=int overrides of the generator's ARCHS entry, e.g. "
                    "n_heads=16,n_kv=2,experts=64,top_k=8 (Qwen3-30B-A3B's 8 query heads per KV head); "
                    "extra.KEY=VALUE sets one of its extra <arch>.KEY keys, extra.KEY= drops it")
    ap.add_argument("--rope-scaling", help="type:factor[:original_context_length], e.g. yarn:4:64 or linear:2; "
                    "or k=v,... rope.scaling keys as given, e.g. type=yarn,factor=4.0,attn_factor=0.8 "
                    "(a float needs its '.'; no float64 reference column then)")
    ap.add_argument("--d-expert", type=int, help="expert width of the fixtures instead of the generator's "
                    "(e.g. 1408, Qwen1.5-MoE-A2.7B's: not a multiple of 256, so llama.cpp's K-quant files fall "
                    "back to Q5_0 / Q8_0 for the expert downs)")
    ap.add_argument("--no-mtp", action="store_true", help="qwen35moe, qwen3next: no trailing MTP block")
    ap.add_argument("--interval", type=int, help="qwen35moe, qwen3next: full_attention_interval (0: no key)")
    ap.add_argument("--legacy-ssm-in", action="store_true", help="qwen3next: the DeltaNet input as one fused ssm_in")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/fwd_dump"], check=True)
    rows, deq = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for arch in a.arch:
            patch = {}
            for f in (a.shape.split(",") if a.shape else []):
                k, v = f.split("=")
                if k.startswith("extra."):      # a key of the generator's extra dict ("extra.k=" drops it)
                    extra = dict(patch.get("extra", mod.ARCHS[arch]["extra"]))
                    if v:
                        extra[k[6:]] = float(v) if "." in v else int(v)
                    else:
                        extra.pop(k[6:], None)
                    patch["extra"] = extra
                else:
                    patch[k] = int(v)
            if a.d_expert:
                patch["d_expert"] = a.d_expert
            gptoss, qwen35 = arch == "gpt-oss", arch in ("qwen35moe", "qwen3next")
            if not (gptoss or qwen35):
                mod.ARCHS[arch] = dict(mod.ARCHS[arch], **patch)
            # (the generator's own K-quant mix needs widths that are multiples of 256: not with --d-expert)
            mixes = ["f32", "q8"] if qwen35 else ([] if a.d_expert else ["kquant"]) + ["f32"] + (["mxfp4"] if gptoss else [])
            for mix in mixes + [f"llama {t}" for t in a.llama_quantize]:
                model = Path(tmp) / f"{arch}-{mix.replace(' ', '-')}.gguf"
                gen = [str(model), "--arch", arch, "--seed", str(a.seed)] + ([] if mix == "kquant" else ["--f32"])
                if gptoss:
                    subprocess.run([sys.executable, str(GPTOSS_GEN), str(model), "--seed", str(a.seed), "--mix",
                                    GPTOSS_MIXES.get(mix, "f32")], check=True)
                elif qwen35:
                    subprocess.run([sys.executable, str(QWEN35_GEN), str(model), "--arch", arch, "--seed", str(a.seed),
                                    *QWEN35_MIXES.get(mix, []), *qwen35_options(a, arch)], check=True)
                elif patch:           # the generator in-process, with the patched shape
                    mod.main(gen)
                else:
                    subprocess.run([sys.executable, str(GEN), *gen], check=True)
                if a.rope_scaling:
                    from tests.model.test_arch_rope_scaling import with_keys
                    if "=" in a.rope_scaling:       # k=v,... : any rope.scaling.* keys, as given
                        keys = {}
                        for f in a.rope_scaling.split(","):
                            k, v = f.split("=")
                            keys[f"rope.scaling.{k}"] = (v if not v.replace(".", "").isdigit() else
                                                          float(v) if "." in v else int(v))
                    else:
                        kind, factor, *orig = a.rope_scaling.split(":")
                        keys = {"rope.scaling.type": kind, "rope.scaling.factor": float(factor)}
                        if orig:
                            keys["rope.scaling.original_context_length"] = int(orig[0])
                    plain = model.with_suffix(".plain.gguf")
                    model.rename(plain)
                    with_keys(plain, model, keys)
                if mix.startswith("llama "):
                    f32 = model.with_suffix(".f32.gguf")
                    model.rename(f32)
                    q = subprocess.run([a.llama_python, "-c", QUANT_SCRIPT, str(f32), str(model),
                                        str(FTYPES[mix.split()[1]])], capture_output=True, text=True)
                    if q.returncode != 0:
                        rows.append((arch, mix, f"llama.cpp's quantizer failed: {q.stderr.strip()[-160:]}"))
                        continue
                    deq.append(f"{arch} {mix}: tensor types {type_census(model)}")
                npy = Path(tmp) / "llama.npy"
                r = subprocess.run([a.llama_python, "-c", LLAMA_SCRIPT, str(model), str(a.threads), str(a.steps),
                                    json.dumps(PROMPT), str(npy)], capture_output=True, text=True)
                if r.returncode != 0:
                    lines = r.stderr.strip().splitlines() or ["?"]
                    err = next((ln for ln in lines if "error loading model" in ln), lines[-1])
                    rows.append((arch, mix, f"llama.cpp failed (rc {r.returncode}): {err[:160]}"))
                    print(rows[-1], r.stderr[-3000:], file=sys.stderr)
                    continue
                info = json.loads(r.stdout.strip().splitlines()[-1])
                ids, V = info["ids"], info["n_vocab"]
                ref = log_softmax(np.load(npy).astype(np.float64))
                try:
                    exact = log_softmax(ours(model, ids, V, tmp, EXACT="1", KV_TYPE="f32"))
                    ex = compare(ref, exact, len(PROMPT))
                    i8 = compare(ref, log_softmax(ours(model, ids, V, tmp)), len(PROMPT))
                except Refused as e:
                    rows.append((arch, mix, f"our engine refuses it: {e}"))
                    print(rows[-1], file=sys.stderr)
                    continue
                if mix != "f32":
                    nt, nbad = ggml_dequant_check(model, a.llama_python)
                    deq.append(f"{arch} {mix}: {nt - nbad}/{nt} quantized tensors dequantize bit-identically in "
                               "llama.cpp and gguf's numpy")
                    print(deq[-1], file=sys.stderr)
                rf = rx = None
                if arch in REFS and not (a.rope_scaling and "=" in a.rope_scaling):   # (k=v keys: no reference)
                    if a.rope_scaling:   # with the published scaled-RoPE definitions
                        from tests.model.test_arch_rope_scaling import scaled_ref
                        fwd = scaled_ref(arch, model, keys).forward(ids)
                    else:
                        fwd = REFS[arch](str(model)).forward(ids)
                    rf = compare(ref, log_softmax(fwd), len(PROMPT))
                    rx = compare(log_softmax(fwd), exact, len(PROMPT))
                rows.append((arch, mix, ex, i8, rf))
                print(f"{arch} {mix}: EXACT=1 {ex[1]}/{ex[0]} max {ex[2]:.2e} gap {ex[3]:.3f}; "
                      f"default {i8[1]}/{i8[0]} max {i8[2]:.2e} gap {i8[3]:.3f}"
                      + (f"; float64 reference {rf[1]}/{rf[0]} max {rf[2]:.2e}" if rf else "")
                      + (f"; reference vs ours EXACT=1 {rx[1]}/{rx[0]} max {rx[2]:.2e}" if rx else "")
                      + f" (use_extra_bufts off: {info['extra_bufts_off']})", file=sys.stderr)
    print("| architecture | weights | ours EXACT=1 (KV f32): greedy = llama.cpp | max \\|Δ log-prob\\| (llama.cpp top 32) "
          "| worst gap | ours default (int8, KV f16): greedy | max \\|Δ log-prob\\| | worst gap "
          "| float64 reference: greedy | max \\|Δ log-prob\\| |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if len(r) == 3:
            print(f"| {r[0]} | {r[1]} | {r[2]} | | | | | | | |")
            continue
        arch, mix, ex, i8, rf = r
        w = {"kquant": "K-quant mix", "f32": "F32", "mxfp4": "MXFP4 experts, BF16 elsewhere",
             "q8": "Q8_0 matrices"}.get(mix, mix)
        ref = f"{rf[1]}/{rf[0]} | {rf[2]:.2e}" if rf else "n/a | n/a"
        print(f"| {arch} | {w} | {ex[1]}/{ex[0]} | {ex[2]:.2e} | {ex[3]:.3f} | {i8[1]}/{i8[0]} | {i8[2]:.2e} | {i8[3]:.3f} "
              f"| {ref} |")
    for line in deq:
        print(f"\n{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
