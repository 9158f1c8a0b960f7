#!/usr/bin/env python3
"""llama.cpp cross-check of the tiny qwen35moe file (a one-off, not a test: make test cannot depend
on a llama.cpp build). native/tools/make_tiny_qwen35moe.py's F32 file runs through llama.cpp
(llama-cpp-python 0.3.36 built from source, which has qwen35moe), through our engine
(native/build/fwd_dump, EXACT=1 KV_TYPE=f32) and through tests/model/qwen35_ref.py's float64
forward, on the same ids: llama.cpp's own greedy continuation of a 10-token prompt, then the whole
sequence teacher-forced (one prefill each). Prints, per pair, greedy agreement over the
continuation and max |d log-prob| over the first side's top 32 tokens. With --q8, llama.cpp's CPU
matmuls quantize activations to Q8_0 rows for Q8_0 weights: its distance to the float64 reference
is then its own rounding (our default int8 path is the like-for-like row).

    bench/qwen35_crosscheck.py [--llama-python /work/llcpp-venv/bin/python] [--steps 12]
                               [--no-mtp] [--interval N] [--q8]     (the generator's options)
"""
from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "bench"))
import llama_child  # noqa: E402  (the llama.cpp child scripts' prelude)
from tests.model.arch_ref import log_softmax  # noqa: E402
from tests.model.qwen35_ref import Qwen35Moe  # noqa: E402

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
SCRIPT = llama_child.PRELUDE + textwrap.dedent("""
    import json, sys
    import numpy as np
    from llama_cpp import Llama
    model, steps, prompt, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    llm = Llama(model_path=model, n_threads=2, n_threads_batch=2, n_ctx=256, n_batch=256,
                logits_all=True, type_k=0, type_v=0, verbose=False)
    llm.reset()
    llm.eval(prompt)
    ids = list(prompt)
    for _ in range(steps):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ids.append(t)
        llm.eval([t])
    llm.reset()
    llm.eval(ids)
    np.save(out, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
    print(json.dumps({"ids": ids}))
""")


def compare(a: np.ndarray, b: np.ndarray, n_prompt: int, ids: list[int]) -> tuple[int, int, float]:
    agree, err = 0, 0.0
    for pos in range(n_prompt - 1, len(ids) - 1):
        agree += int(np.argmax(b[pos]) == np.argmax(a[pos]))
        top = np.argsort(-a[pos])[:32]
        err = max(err, float(np.abs(a[pos, top] - b[pos, top]).max()))
    return agree, len(ids) - n_prompt, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-python", default="/work/llcpp-venv/bin/python")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--no-mtp", action="store_true")
    ap.add_argument("--interval", type=int)
    ap.add_argument("--q8", action="store_true")
    a = ap.parse_args()
    gen = (["--no-mtp"] if a.no_mtp else []) + (["--q8"] if a.q8 else []) + (
        ["--interval", str(a.interval)] if a.interval is not None else [])
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-qwen35moe.gguf"
        subprocess.run([sys.executable, str(ROOT / "native/tools/make_tiny_qwen35moe.py"), str(model), *gen],
                       check=True)
        out = Path(tmp) / "llama.npy"
        r = subprocess.run([a.llama_python, "-c", SCRIPT, str(model), str(a.steps), json.dumps(PROMPT), str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama.cpp failed: {r.stderr[-2000:]}")
        ids = json.loads(r.stdout.strip().splitlines()[-1])["ids"]
        llama = log_softmax(np.load(out).astype(np.float64))
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/fwd_dump"], check=True)
        eo = Path(tmp) / "ours.f32"
        subprocess.run([str(ROOT / "native/build/fwd_dump"), str(model), str(eo), *map(str, ids)], check=True,
                       env=dict(os.environ, EXACT="1", KV_TYPE="f32"))
        ours = log_softmax(np.fromfile(eo, dtype=np.float32).reshape(len(ids), -1).astype(np.float64))
        subprocess.run([str(ROOT / "native/build/fwd_dump"), str(model), str(eo), *map(str, ids)], check=True)
        dflt = log_softmax(np.fromfile(eo, dtype=np.float32).reshape(len(ids), -1).astype(np.float64))
        ref = log_softmax(Qwen35Moe(str(model)).forward(ids))
    print(f"ids: {ids}")
    for name, x, y in (("llama.cpp vs ours EXACT", llama, ours), ("llama.cpp vs float64 reference", llama, ref),
                       ("float64 reference vs ours EXACT", ref, ours),
                       ("llama.cpp vs ours default (int8 activations, fp16 K/V)", llama, dflt)):
        agree, steps, err = compare(x, y, len(PROMPT), ids)
        print(f"{name}: greedy {agree}/{steps}, max |d log-prob| (top 32) {err:.2e}")


if __name__ == "__main__":
    main()
