#!/usr/bin/env python3
"""Perplexity of the dense source vs the default MoE, computed with OUR ENGINE's forward pass.

    .venv/bin/python bench/quality.py [--moe models/smollm2-135m-moe16.gguf]
                                      [--dense models/cache/SmolLM2-135M-Instruct.Q4_1.gguf]
                                      [--topk 16]   # also the MoE with TOPK experts

Held-out sets of shared/reference/default-model.md §3.1, 512 tokens each: pydoc_data.topics
characters 400,000-440,000 (sorted keys joined by blank lines) and KJV verses 30,000-30,399
(joined by spaces). Tokens from the engine's tokenizer (`--tokenize`), logits from
native/tests/fwd_dump (the engine's model_forward over all positions in one prefill; the
mux protocol has no per-prompt-token log-probs), perplexity = exp(mean NLL of tokens 1..511).
Expect roughly +35-45 % for the MoE (the doc measured 19.55 -> 26.7 and 34.27 -> 49.6).
Also with EXACT=1 (float activations): the conversion's own cost, without int8 rounding.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
N = 512
sys.path.insert(0, str(ROOT / "native" / "tools"))
from build_default_model import tokenize  # noqa: E402  (the engine's --tokenize, one copy)


def texts():
    from pydoc_data.topics import topics
    pydoc = "\n\n".join(topics[k] for k in sorted(topics))
    verses = [json.loads(ln)["text"] for ln in (ROOT / "models/cache/kjv.jsonl").read_text("utf-8").splitlines()
              if ln.strip()]
    return {"pydoc": pydoc[400_000:440_000], "KJV": " ".join(verses[30_000:30_400])}


def perplexity(fwd, model, ids, env=None):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "lg.f32")
        subprocess.run([str(fwd), str(model), out, *map(str, ids)], check=True, env={**os.environ, **(env or {})})
        lg = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1).astype(np.float64)
    lg -= lg.max(axis=1, keepdims=True)
    lp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
    nll = -lp[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moe", default=ROOT / "models/smollm2-135m-moe16.gguf")
    ap.add_argument("--dense", default=ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--topk", type=int, default=16, help="extra MoE row with TOPK=N experts (0: none)")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/colibri-engine", "build/fwd_dump"], check=True)
    engine, fwd = ROOT / "native/build/colibri-engine", ROOT / "native/build/fwd_dump"
    rows = [("dense (source)", a.dense, None), ("MoE top-8 (default)", a.moe, None)]
    if a.topk:
        rows.append((f"MoE TOPK={a.topk}", a.moe, {"TOPK": str(a.topk)}))
    # float activations (EXACT=1): what the MoE conversion costs without the int8 rounding
    exact = [("dense, EXACT=1", a.dense, {"EXACT": "1"}), ("MoE top-8, EXACT=1", a.moe, {"EXACT": "1"})]
    sets = texts()
    res = {}
    for name, text in sets.items():
        ids = tokenize(engine, a.dense, text)[:N]
        assert len(ids) == N, (name, len(ids))
        for label, model, env in rows + exact:
            res[label, name] = perplexity(fwd, model, ids, env)
    print("| model | " + " | ".join(f"{s} ppl" for s in sets) + " |")
    print("|---|" + "---|" * len(sets))
    base = rows[0][0]
    for label, _, _ in rows:
        cells = []
        for s in sets:
            v = res[label, s]
            cells.append(f"{v:.2f}" if label == base else f"{v:.2f} ({100 * (v / res[base, s] - 1):+.1f} %)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for label, _, _ in exact:
        cells = []
        for s in sets:
            v, ref = res[label, s], res[exact[0][0], s]
            cells.append(f"{v:.2f}" if label == exact[0][0] else f"{v:.2f} ({100 * (v / ref - 1):+.1f} % vs dense EXACT)")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print(f"\n{N} tokens per set; logits from the engine's forward (native/tests/fwd_dump).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
