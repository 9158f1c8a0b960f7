#!/usr/bin/env python3
"""The engine against the numpy reference on the FULL default model (the CI test is
tests/model/test_oracle.py; this is its full report, ~4 minutes on 2 cores).

    .venv/bin/python bench/oracle.py [--moe models/smollm2-135m-moe16.gguf]
                                     [--dense models/cache/SmolLM2-135M-Instruct.Q4_1.gguf]
                                     [--steps 64]

Engine: serve mode, greedy, the five prompts of tests/model/test_oracle.py in five slots at once
(batched decode), `logprobs=32`, TOPK=16 (every expert: with the file's unit gating that is the
dense FFN it encodes); once with EXACT=1 (float activations), once with the default int8
activations; EXACT runs with the KV cache in float32 and in fp16 (KV_TYPE; an engine without
it ignores the variable and stays float32). References (native/tools/llama_ref.py, float64 math
on the dequantized weights): the MoE file with every expert active (also with K/V rounded to
fp16 as they enter the cache), and the dense source file it was built from.

Columns, per (engine, reference):
* greedy: per prompt k/N, N = the reference's own greedy decisions (64, or fewer when it picks
  EOS, which counts as a decision), k = how many of them the engine's stream makes the same
  before the first difference (an engine turn ending by EOS = picking EOS).
* forced: steps where the engine's token is the reference's argmax when the reference is fed
  the engine's stream (teacher forcing), all prompts together.
* err: max |engine - reference| log-prob over the engine's top 32, at the first step and at any
  step (teacher-forced); the engine prints 4 decimals, so 5e-5 is the floor.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.model.oracle import EOS, Model, engine_greedy, forced  # noqa: E402
from tests.model.test_oracle import PROMPTS  # noqa: E402
from check_tokenizer import Reference  # noqa: E402  (native/tools is on sys.path via tests.model.oracle)


def decisions(gen, steps):
    return gen.ids + ([EOS] if len(gen.ids) < steps else [])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moe", default=ROOT / "models/smollm2-135m-moe16.gguf")
    ap.add_argument("--dense", default=ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/colibri-engine"], check=True)
    binary = ROOT / "native/build/colibri-engine"
    tok = Reference(str(a.moe))
    ids = [tok.encode(p.encode("utf-8")) for p in PROMPTS]
    dense_tok = Reference(str(a.dense))
    assert ids == [dense_tok.encode(p.encode("utf-8")) for p in PROMPTS]     # one vocabulary
    engines = {}
    for label, env in [("EXACT=1, KV f32", {"EXACT": "1", "KV_TYPE": "f32"}),
                       ("EXACT=1, KV f16", {"EXACT": "1", "KV_TYPE": "f16"}),
                       ("int8 (default), default KV", {})]:
        t = time.time()
        engines[label] = engine_greedy(binary, a.moe, PROMPTS, a.steps, timeout=600, TOPK="16", **env)
        print(f"engine {label}: {time.time() - t:.1f} s", file=sys.stderr)
    moe = Model(str(a.moe), top_k=16)
    refs = [  # (label, model, its K/V rounded to fp16, the engine runs compared with it)
        ("numpy MoE, all 16 experts", moe, False, ["EXACT=1, KV f32", "int8 (default), default KV"]),
        ("numpy MoE, all 16 experts, fp16 K/V", moe, True, ["EXACT=1, KV f16"]),
        ("numpy dense source", None, False, ["EXACT=1, KV f32", "int8 (default), default KV"]),
    ]
    rows = []
    for rlabel, m, kv_f16, against in refs:
        t = time.time()
        m = m or Model(str(a.dense))
        m.kv_f16 = kv_f16
        greedy = [m.greedy(i, a.steps, eos=EOS)[0] for i in ids]
        print(f"reference {rlabel}: greedy {time.time() - t:.1f} s", file=sys.stderr)
        for elabel in against:
            cells, agree, steps, first, worst = [], 0, 0, 0.0, 0.0
            for i, g, ref in zip(ids, engines[elabel], greedy):
                eng = decisions(g, a.steps)
                k = 0
                while k < min(len(eng), len(ref)) and eng[k] == ref[k]:
                    k += 1
                cells.append(f"{k}/{len(ref)}")
                f = forced(m, i, g)
                agree, steps = agree + f.agree, steps + f.steps
                first, worst = max(first, f.first_step_err), max(worst, f.max_step_err)
            rows.append((elabel, rlabel, " ".join(cells), f"{agree}/{steps}", f"{first:.2e}", f"{worst:.2e}"))
    print("| engine (TOPK=16) | reference | greedy, per prompt | forced | err first step | err any step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n{len(PROMPTS)} prompts, {a.steps} steps; engine top-32 log-probs vs the float64 reference.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
