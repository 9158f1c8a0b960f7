#!/usr/bin/env python3
"""bench_mix.py — decode speed of one architecture's bench-shape fixture (make_arch_fixture.py
--bench-shape: d_model 1024, 8 layers, 16 experts x 512, top-4) in each weight-type mix, through
native/build/bench_fwd (not a test; prints a markdown table).

    native/tools/bench_mix.py [--arch qwen3moe] [--runs 3] [--threads 1]

Columns: weight bytes one decode token reads (every non-expert matrix + top_k / n_experts of the
expert matrices, file bytes), best-of-runs single-row decode tok/s and CPU ms per token, and
GB/s of file bytes per CPU-second, with the ratio to the Q4_1 file.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from gguf import GGUFReader

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MIXES = ["q4_1", "q4_k_m", "q5_k_m", "q4_k", "q6_k", "q8_0", "q3_k_m", "q2_k"]


def bytes_per_token(path):
    r = GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    f = r.fields
    E = int(f[f"{arch}.expert_count"].parts[-1][0])
    K = int(f[f"{arch}.expert_used_count"].parts[-1][0])
    total = 0.0
    for t in r.tensors:
        if t.name == "token_embd.weight" or len(t.shape) == 1:
            continue
        total += t.n_bytes * (K / E if "_exps." in t.name else 1.0)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen3moe")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=48)
    a = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/bench_fwd"], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for mix in MIXES:
            paths[mix] = Path(d) / f"{mix}.gguf"
            subprocess.run([sys.executable, str(HERE / "make_arch_fixture.py"), str(paths[mix]), "--arch", a.arch,
                            "--bench-shape", "--mix", mix], check=True)
        best = {}
        for _ in range(a.runs):              # interleaved: every mix once per round
            for mix in MIXES:
                out = subprocess.run([str(ROOT / "native" / "build" / "bench_fwd"), str(paths[mix]), "1", str(a.steps),
                                      "16"], capture_output=True, text=True, env=env, check=True).stdout
                m = re.search(r"decode B=1: ([\d.]+) ms/step wall \(([\d.]+) tok/s\), ([\d.]+) ms CPU/step", out)
                cpu = float(m.group(3))
                if mix not in best or cpu < best[mix][1]:
                    best[mix] = (float(m.group(2)), cpu)
        rows = [(mix, bytes_per_token(paths[mix]), *best[mix]) for mix in MIXES]
    base = next(r for r in rows if r[0] == "q4_1")
    gbs = {r[0]: r[1] / (r[3] * 1e-3) * 1e-9 for r in rows}
    print(f"{a.arch} bench shape, single-row decode, {a.threads} thread(s), best of {a.runs} interleaved rounds")
    print("| mix | MB read per token | decode tok/s | CPU ms/token | GB/s of file bytes per CPU-s | x Q4_1 |")
    print("|---|---|---|---|---|---|")
    for mix, b, tok, cpu in rows:
        print(f"| {mix} | {b / 1e6:.2f} | {tok:.1f} | {cpu:.2f} | {gbs[mix]:.2f} | {gbs[mix] / gbs['q4_1']:.2f} |")
    del base


if __name__ == "__main__":
    main()
