#!/usr/bin/env python3
"""The quality/speed Pareto table of the default MoE against its dense source, all measured with
OUR ENGINE in one run on one machine.

    .venv/bin/python bench/quality.py [--moe models/smollm2-135m-moe16.gguf]
                                      [--dense models/cache/SmolLM2-135M-Instruct.Q4_1.gguf]
                                      [--experts 4,6,8,10,12,13,14,16] [--runs 3] [--exact]

One row per experts-per-token count (the engine's TOPK, which gives the same logits as a
request's `experts=N`; tested in native/tests/test_model.c), plus the dense model:

* held-out perplexity, pydoc and KJV (shared/reference/default-model.md §3.1, 512 tokens each:
  pydoc_data.topics characters 400,000-440,000, sorted keys joined by blank lines; KJV verses
  30,000-30,399 joined by spaces), and its ratio to the dense model's. Tokens from the engine's
  tokenizer (`--tokenize`); logits from native/tests/fwd_dump (the engine's model_forward over all
  positions in one prefill; the mux protocol has no per-prompt-token log-probs); perplexity =
  exp(mean NLL of tokens 1..511).
* decode tok/s, single stream, greedy, 128 tokens after a short prompt (`colibri-engine -p`, one
  thread by default, best of --runs interleaved rounds: the machine may be shared), and its ratio
  to the dense model's;
* weights read per token: parameters and bytes of every tensor a token's forward reads (attention,
  norms, router, shared expert, the selected experts, the tied head; the embedding row is
  negligible), as a fraction of the dense model's.

Why the ratios: absolute figures depend on the host; the dense model in the same run is the bar
(issue 11: perplexity within 1.10x on both texts at the shipped default). --exact adds the dense
and the default with float activations (EXACT=1): the conversion's own cost, without the int8
rounding of activations.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFReader

ROOT = Path(__file__).resolve().parents[1]
N = 512
sys.path.insert(0, str(ROOT / "native" / "tools"))
from build_default_model import tokenize  # noqa: E402  (the engine's --tokenize, one copy)

DECODE_PROMPT = "The history of the printing press begins"
DECODE_TOKENS = 128


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


def decode_tok_s(engine, model, env, threads):
    """Single-stream greedy decode speed of one one-shot run."""
    p = subprocess.run([str(engine), "-m", str(model), "-p", DECODE_PROMPT, "-n", str(DECODE_TOKENS),
                        "--threads", str(threads)],
                       check=True, capture_output=True, text=True, env={**os.environ, **(env or {})})
    m = re.search(r"decode: (\d+) tokens, ([\d.]+) tok/s", p.stderr)
    assert m, p.stderr
    return float(m.group(2))


def weights_per_token(path, k=None):
    """(parameters, bytes) a token reads: every tensor once, except routed experts (`_exps`), of
    which k of n_experts; the tied embedding counted once (as the head)."""
    r = GGUFReader(str(path))
    n_exp = 0
    f = r.fields.get("llama.expert_count")
    if f is not None:
        n_exp = int(f.parts[f.data[0]][0])
    params = nbytes = 0.0
    for t in r.tensors:
        share = k / n_exp if "_exps." in t.name else 1.0
        params += share * int(t.n_elements)
        nbytes += share * int(t.n_bytes)
    return params, nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moe", default=ROOT / "models/smollm2-135m-moe16.gguf")
    ap.add_argument("--dense", default=ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--experts", default="4,6,8,10,12,13,14,16", help="experts-per-token counts to measure")
    ap.add_argument("--runs", type=int, default=5, help="decode rounds (each runs every row once; best kept)")
    ap.add_argument("--threads", type=int, default=1,
                    help="decode threads (1: a shared machine's preemptions stall one thread, not a pool)")
    ap.add_argument("--exact", action="store_true", help="also float activations (EXACT=1)")
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/colibri-engine", "build/fwd_dump"], check=True)
    engine, fwd = ROOT / "native/build/colibri-engine", ROOT / "native/build/fwd_dump"
    r = GGUFReader(str(a.moe))
    default_k = int(r.fields["llama.expert_used_count"].parts[r.fields["llama.expert_used_count"].data[0]][0])
    counts = sorted({int(x) for x in a.experts.split(",")} | {default_k})
    rows = [("dense (source)", a.dense, None, None)]
    rows += [(f"MoE {k}" + (" (default)" if k == default_k else ""), a.moe, {"TOPK": str(k)}, k) for k in counts]
    if a.exact:
        rows += [("dense, EXACT=1", a.dense, {"EXACT": "1"}, None),
                 (f"MoE {default_k}, EXACT=1", a.moe, {"EXACT": "1"}, default_k)]
    sets = texts()
    ids = {}
    for name, text in sets.items():
        ids[name] = tokenize(engine, a.dense, text)[:N]
        assert len(ids[name]) == N, (name, len(ids[name]))
    dense_p, dense_b = weights_per_token(a.dense)
    res = {}
    for label, model, env, k in rows:
        ppl = {s: perplexity(fwd, model, ids[s], env) for s in sets}
        p, b = weights_per_token(model, k)
        res[label] = [ppl, float("nan"), p / dense_p, b / dense_b]
        print(f"perplexity of {label}", file=sys.stderr, flush=True)
    # decode speed in interleaved rounds, best per row: load from other processes comes in bursts,
    # and interleaving spreads each burst over all rows instead of one
    for _ in range(a.runs):
        for label, model, env, k in rows:
            if "EXACT" not in (env or {}):
                t = decode_tok_s(engine, model, env, a.threads)
                res[label][1] = t if res[label][1] != res[label][1] else max(res[label][1], t)
        print("decode round done", file=sys.stderr, flush=True)
    base = res[rows[0][0]]
    print("| model | experts/token | " + " | ".join(f"{s} ppl (× dense)" for s in sets)
          + " | decode tok/s (× dense) | params read/token | bytes read/token |")
    print("|---|---|" + "---|" * len(sets) + "---|---|---|")
    for label, _, env, k in rows:
        ppl, tps, pf, bf = res[label]
        ref = res["dense, EXACT=1"] if "EXACT" in (env or {}) else base
        cells = [f"{ppl[s]:.2f}" + ("" if ref is res[label] else f" ({ppl[s] / ref[0][s]:.3f})") for s in sets]
        speed = "—" if tps != tps else f"{tps:.1f}" + ("" if res[label] is base else f" ({tps / base[1]:.2f})")
        print(f"| {label} | {k if k else '— (dense FFN)'} | " + " | ".join(cells)
              + f" | {speed} | {pf:.3f} | {bf:.3f} |")
    print(f"\n{N} tokens per set; logits from the engine's forward (native/tests/fwd_dump); decode: best of "
          f"{a.runs} interleaved one-shot runs of {DECODE_TOKENS} greedy tokens, {a.threads} thread(s); "
          f"fractions against the dense file "
          f"({dense_p / 1e6:.1f} M parameters, {dense_b / 1e6:.1f} MB read per token).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
