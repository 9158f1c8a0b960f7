#!/usr/bin/env python3
"""bench_mix.py — decode speed of one architecture's bench-shape fixture (make_arch_fixture.py
--bench-shape: d_model 1024, 8 layers, 16 experts x 512, top-4) in each weight-type mix, through
native/build/bench_fwd (not a test; prints a markdown table).

    native/tools/bench_mix.py [--arch qwen3moe] [--runs 3] [--threads 1] [--build DIR ...] [--keep DIR]
                              [--mixes q4_1,q4_k_m,...]

--build: the folder(s) holding bench_fwd (default native/build, made first); with several, every
build runs every mix in each round (interleaved) and the table has a row per build and mix.
--keep: write the fixtures there and reuse them on the next run (same arguments, same bytes).
--dram-shape: instead of --bench-shape, a shape whose weights stream from memory: 16 layers, 128 experts
x 512, top-8 (~2 GB at Q4_1, 166 MB read per token; this host's L3 is 480 MiB); ~3 minutes to build
each fixture (kept as ARCH-MIX-dram.gguf).

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
MIXES = ["q4_1", "q4_k_m", "q4_k_m_file", "q5_k_m", "q4_k", "q6_k", "q8_0", "q3_k_m", "q2_k"]


# make_arch_fixture.py's builder with the --dram-shape dimensions (argv: tools dir, out, arch, mix)
DRAM_FIXTURE = """
import sys
sys.path.insert(0, sys.argv[1])
import make_arch_fixture as m
h = m.ARCHS[sys.argv[3]]
m.ARCHS[sys.argv[3]] = dict(h, d_model=1024, n_heads=8, n_kv=4, head_dim=128, layers=16, experts=128, top_k=8,
                            d_expert=512, d_ff=2048, shexp=512 if h["shexp"] else 0)
m.main([sys.argv[2], "--arch", sys.argv[3], "--mix", sys.argv[4]])
"""


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
    ap.add_argument("--build", action="append", help="folder with bench_fwd (repeatable)")
    ap.add_argument("--keep", help="folder for the fixtures, reused when present")
    ap.add_argument("--mixes", help="comma-separated mixes (default: " + ",".join(MIXES) + ")")
    ap.add_argument("--dram-shape", action="store_true", help="16 layers, 128 experts x 512, top-8 (~2 GB)")
    a = ap.parse_args()
    mixes = a.mixes.split(",") if a.mixes else MIXES
    if "q4_1" not in mixes:
        mixes = ["q4_1"] + mixes
    if not a.build:
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/bench_fwd"], check=True)
    builds = [Path(b) for b in a.build] if a.build else [ROOT / "native" / "build"]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(a.keep) if a.keep else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        paths = {}
        for mix in mixes:
            paths[mix] = d / f"{a.arch}-{mix}{'-dram' if a.dram_shape else ''}.gguf"
            if not paths[mix].exists() and a.dram_shape:
                subprocess.run([sys.executable, "-c", DRAM_FIXTURE, str(HERE), str(paths[mix]), a.arch, mix], check=True)
            elif not paths[mix].exists():
                subprocess.run([sys.executable, str(HERE / "make_arch_fixture.py"), str(paths[mix]), "--arch", a.arch,
                                "--bench-shape", "--mix", mix], check=True)
        best = {}
        for _ in range(a.runs):              # interleaved: every build and mix once per round
            for mix in mixes:
                for b in builds:
                    out = subprocess.run([str(b / "bench_fwd"), str(paths[mix]), "1", str(a.steps), "16"],
                                         capture_output=True, text=True, env=env, check=True).stdout
                    m = re.search(r"decode B=1: ([\d.]+) ms/step wall \(([\d.]+) tok/s\), ([\d.]+) ms CPU/step", out)
                    cpu = float(m.group(3))
                    if (b, mix) not in best or cpu < best[b, mix][1]:
                        best[b, mix] = (float(m.group(2)), cpu)
        nbytes = {mix: bytes_per_token(paths[mix]) for mix in mixes}
    print(f"{a.arch} {'dram' if a.dram_shape else 'bench'} shape, single-row decode, {a.threads} thread(s), best of {a.runs} interleaved rounds "
          "by CPU time")
    print("| build | mix | MB read per token | decode tok/s | CPU ms/token | GB/s of file bytes per CPU-s | x Q4_1 |")
    print("|---|---|---|---|---|---|---|")
    for b in builds:
        gbs = {mix: nbytes[mix] / (best[b, mix][1] * 1e-3) * 1e-9 for mix in mixes}
        for mix in mixes:
            tok, cpu = best[b, mix]
            print(f"| {b} | {mix} | {nbytes[mix] / 1e6:.2f} | {tok:.1f} | {cpu:.2f} | {gbs[mix]:.2f} | "
                  f"{gbs[mix] / gbs['q4_1']:.2f} |")


if __name__ == "__main__":
    main()
