"""gpt-oss against llama.cpp itself (llama-cpp-python 0.3.36 or later, built from source: it runs
`gpt-oss`): runs only when COLIBRI_LLAMA_PYTHON names that build's Python (make test does not
depend on it; bench/arch_crosscheck.py --arch gpt-oss prints the full table, native/README.md
has the figures).

The F32 tiny file (window 8, 4 layers, YaRN, sinks, biases, clamps reached): llama.cpp's own 24
greedy tokens after a 10-token prompt, then the whole sequence teacher-forced in one prefill
(llama.cpp's K/V in F32): our EXACT=1 engine and the float64 reference both give llama.cpp's
greedy tokens with log-probabilities within 2e-3 over llama.cpp's top 32.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.model.arch_ref import REFS, log_softmax
from tests.support import procs
from tests.support.procs import ROOT

LLAMA_PYTHON = os.environ.get("COLIBRI_LLAMA_PYTHON", "")
pytestmark = pytest.mark.skipif(not LLAMA_PYTHON, reason="COLIBRI_LLAMA_PYTHON (a llama-cpp-python build) not set")
TOL = 2e-3


def test_engine_and_reference_match_llama_cpp(tmp_path, engine_binary):
    sys.path.insert(0, str(ROOT / "bench"))
    import arch_crosscheck as X
    model = procs.make_arch_fixture(tmp_path / "gpt-oss.gguf", "gpt-oss", "--window", "8")
    npy = tmp_path / "llama.npy"
    r = subprocess.run([LLAMA_PYTHON, "-c", X.LLAMA_SCRIPT, str(model), "2", "24", json.dumps(X.PROMPT), str(npy)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    ids, vocab = info["ids"], info["n_vocab"]
    llama = log_softmax(np.load(npy).astype(np.float64))
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/fwd_dump"], check=True)
    ours = log_softmax(X.ours(model, ids, vocab, tmp_path, EXACT="1", KV_TYPE="f32"))
    ref = log_softmax(REFS["gpt-oss"](str(model)).forward(ids))
    for label, lp in (("ours EXACT=1", ours), ("float64 reference", ref)):
        steps, agree, err, _ = X.compare(llama, lp, len(X.PROMPT))
        print(f"gpt-oss F32 vs llama.cpp: {label} greedy {agree}/{steps}, max |d log-prob| {err:.2e}")
        assert agree == steps and err <= TOL, f"{label}: {agree}/{steps} greedy, {err:.3g}"
