#!/usr/bin/env python3
"""Engine benchmark (not a test): our engine on the default model vs llama.cpp on the dense source.

    .venv/bin/python bench/engine.py [--runs 3] [--threads N] [--prompt-tokens 256] [--gen 128]

Ours (serve mode, mux protocol, greedy): prefill tok/s (one prompt into an empty slot: SUBMIT ->
first DATA), single-stream decode tok/s (steady state between the first and the last DATA),
aggregate decode tok/s with 4, 8 and 16 slots (SUBMITs to distinct slots at once; tokens emitted
between the moment every stream has started and the first DONE, over that window), peak RSS
(VmHWM). Then the same with EXPERT_RAM_MB = a quarter of the routed-expert bytes (the rest is
read from the file on use).

llama.cpp: llama-cpp-python built from source in bench/.venv-llama (a benchmark-only tool,
never a runtime dependency):
    python3 -m venv bench/.venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DGGML_CUDA=OFF" \\
        bench/.venv-llama/bin/pip install llama-cpp-python==0.3.16      # ~7-10 min on 2 cores
on the dense SmolLM2 Q4_1 file, same thread count, same prompt tokens, greedy: prefill tok/s,
decode tok/s (eval one token at a time, argmax of its logits), peak RSS of its process. Its high-level API has no parallel sequences, so it has
no multi-slot row. Medians of --runs runs. Prints a markdown table (ratios first).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "native" / "tools"))
from build_default_model import tokenize  # noqa: E402  (the engine's --tokenize, one copy)
MOE = ROOT / "models/smollm2-135m-moe16.gguf"
DENSE = ROOT / "models/cache/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_PY = ROOT / "bench/.venv-llama/bin/python"
ENGINE = ROOT / "native/build/colibri-engine"
READY = b"\x01\x01READY\x01\x01\n"


class Mux:
    """Minimal mux client: timestamps of DATA/ACCEPT/DONE per request id. The one driver of the
    engine's mux protocol for the benchmarks (bench/scale.py and bench/webpath.py use it too):
    subclasses add what they measure through on_data / on_line, called on the reader thread with
    self.cond held."""

    def __init__(self, env, *, stderr=subprocess.DEVNULL, preexec_fn=None, ready_timeout=None):
        self.t_start = time.perf_counter()
        self.p = subprocess.Popen([str(ENGINE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=stderr, env=env, preexec_fn=preexec_fn)
        self.cond = threading.Condition()
        self.data: dict[int, list[float]] = {}
        self.done: dict[int, tuple[float, list[str]]] = {}
        self.accept: dict[int, float] = {}
        self.eof = False
        self.started()
        f = self.p.stdout
        deadline = None if ready_timeout is None else time.monotonic() + ready_timeout
        while True:
            ln = f.readline()
            if not ln:
                raise RuntimeError("engine exited before READY" + self.exit_detail())
            if ln == READY:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise RuntimeError("READY timeout")
        self.t_ready = time.perf_counter()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 1

    def started(self) -> None:
        """Hook: runs once the process exists, before READY is awaited (e.g. a stderr reader)."""

    def exit_detail(self) -> str:
        """Hook: what to add to the error when the engine exits before READY."""
        return ""

    def on_data(self, rid: int, t: float) -> None:
        """Hook: a DATA frame of request rid arrived at t (its payload already read)."""

    def on_line(self, kind: str, parts: list[str], t: float) -> None:
        """Hook: any other line (PERF, ROUTES, TIERS, ...)."""

    def _read(self):
        f = self.p.stdout
        while True:
            line = f.readline()
            if not line:
                with self.cond:
                    self.eof = True
                    self.cond.notify_all()
                return
            t = time.perf_counter()
            parts = line.decode("utf-8", "replace").split()
            if not parts:
                continue
            kind = parts[0]
            if kind == "DATA":
                f.read(int(parts[2]) + 1)
            with self.cond:
                if kind == "DATA":
                    self.data.setdefault(int(parts[1]), []).append(t)
                    self.on_data(int(parts[1]), t)
                elif kind == "ACCEPT":
                    self.accept[int(parts[1])] = t
                elif kind == "DONE" or (kind == "ERROR" and parts[1] != "0"):
                    self.done[int(parts[1])] = (t, parts)
                    self.cond.notify_all()
                else:
                    self.on_line(kind, parts, t)

    def run(self, prompts, slots, max_tokens, *, options="", timeout=600, check=True):
        """Submits prompts[i] to slots[i] in one write (options: SUBMIT extensions, e.g.
        "routes=1"); returns (t_submit, ids) once all are done, the engine exited or timeout
        passed. check: every request must have ended with DONE."""
        ids, frames = [], b""
        tail = f" {options}" if options else ""
        for p, s in zip(prompts, slots):
            rid, self.next_id = self.next_id, self.next_id + 1
            b = p.encode()
            frames += f"SUBMIT {rid} {s} {len(b)} {max_tokens} 0 1{tail}\n".encode() + b + b"\n"
            ids.append(rid)
        t0 = time.perf_counter()
        self.p.stdin.write(frames)
        self.p.stdin.flush()
        with self.cond:
            self.cond.wait_for(lambda: self.eof or all(i in self.done for i in ids), timeout=timeout)
        if check:
            for i in ids:
                assert i in self.done and self.done[i][1][0] == "DONE", self.done.get(i, "no DONE")
        return t0, ids

    def peak_rss_mb(self):
        for ln in open(f"/proc/{self.p.pid}/status"):
            if ln.startswith("VmHWM:"):
                return int(ln.split()[1]) / 1024
        return float("nan")

    def close(self, timeout=120):
        """Closes stdin (the engine exits at EOF) and returns its exit status; killed past timeout."""
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return self.p.wait()


def prompts_text(n_words_list):
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics))
    out, pos = [], 0
    for n in n_words_list:
        out.append(text[pos:pos + n])
        pos += n + 1000
    return out


def tokens_of(text, model):
    return tokenize(ENGINE, model, text)


def cut_to_tokens(texts, n, model):
    """Each text shortened to about n tokens (engine tokenizer)."""
    out = []
    for t in texts:
        ids = tokens_of(t, model)
        while len(ids) > n:
            t = t[: int(len(t) * n / len(ids) * 0.98)]
            ids = tokens_of(t, model)
        out.append(t)
    return out


def expert_bytes(model):
    from gguf import GGUFReader
    r = GGUFReader(str(model))
    return sum(int(t.n_bytes) for t in r.tensors if "_exps." in t.name)


def bench_ours(args, extra_env, prompts):
    env = dict(os.environ, SERVE="1", SERVE_BATCH="1", SNAP=str(args.model), KV_SLOTS="64", CTX="1024",
               USAGE_SAVE="0", KVSAVE="0", OMP_NUM_THREADS=str(args.threads), **extra_env)
    env["USAGE_FILE"] = "/dev/null"
    res = {"prefill": [], "decode": [], 4: [], 8: [], 16: []}
    m = Mux(env)
    slot = 0
    try:
        m.run([prompts[-1]], [63], 16)          # warm-up: page cache, expert cache, thread pool
        for r in range(args.runs):
            # prefill: one prompt of ~P tokens into an empty slot, 1 token generated
            t0, (i,) = m.run([prompts[r % len(prompts)]], [slot], 1)
            slot += 1
            res["prefill"].append(args.prompt_tokens / (m.data[i][0] - t0))
            # single-stream decode
            t0, (i,) = m.run([f"{r} " + prompts[(r + 1) % len(prompts)][:200]], [slot], args.gen)
            slot += 1
            ts = m.data[i]
            res["decode"].append((len(ts) - 1) / (ts[-1] - ts[0]))
            for n in (4, 8, 16):
                ps = [f"{r}.{k} " + prompts[k % len(prompts)][:200] for k in range(n)]
                t0, ids = m.run(ps, [(slot + k) % 64 for k in range(n)], args.gen)
                slot = (slot + n) % 64
                start = max(m.data[i][0] for i in ids)
                end = min(m.data[i][-1] for i in ids)
                toks = sum(sum(1 for t in m.data[i] if start < t <= end) for i in ids)
                res[n].append(toks / (end - start))
        res["rss"] = m.peak_rss_mb()
    finally:
        m.close()
    return {k: (statistics.median(v) if isinstance(v, list) else v) for k, v in res.items()}


def rss_serving(args, slots=8):
    """Peak RSS of a fresh engine serving `slots` conversations at once (KV_SLOTS=slots, CTX 4096):
    the figure a deployment sees. The main runs use 64 slots so every run gets a fresh slot, and
    their peak counts the KV of all of them."""
    env = dict(os.environ, SERVE="1", SERVE_BATCH="1", SNAP=str(args.model), KV_SLOTS=str(slots), CTX="4096",
               USAGE_SAVE="0", KVSAVE="0", OMP_NUM_THREADS=str(args.threads), USAGE_FILE="/dev/null")
    m = Mux(env)
    try:
        prompts = cut_to_tokens(prompts_text([1400] * 4), args.prompt_tokens, args.model)
        m.run([prompts[k % len(prompts)] for k in range(slots)], list(range(slots)), args.gen)
        return m.peak_rss_mb()
    finally:
        m.close()


LLAMA_SCRIPT = textwrap.dedent("""
    import json, sys, time, statistics
    from llama_cpp import Llama
    model, threads, runs, gen, prompts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=1024, n_batch=512, verbose=False)
    llm.eval(llm.tokenize(prompts[-1].encode(), add_bos=False)); llm.reset()   # warm-up
    pre, dec = [], []
    for r in range(runs):
        toks = llm.tokenize(prompts[r % len(prompts)].encode(), add_bos=False, special=True)
        llm.reset()
        t = time.perf_counter(); llm.eval(toks); pre.append(len(toks) / (time.perf_counter() - t))
        llm.reset()
        toks = llm.tokenize((str(r) + " " + prompts[(r + 1) % len(prompts)][:200]).encode(), add_bos=False, special=True)
        llm.eval(toks)
        ts = [time.perf_counter()]
        for i in range(gen - 1):
            tok = int(llm.scores[llm.n_tokens - 1].argmax())
            if tok == llm.token_eos():
                break
            llm.eval([tok])
            ts.append(time.perf_counter())
        dec.append((len(ts) - 1) / (ts[-1] - ts[0]))
    rss = [int(l.split()[1]) / 1024 for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]
    print(json.dumps({"prefill": statistics.median(pre), "decode": statistics.median(dec), "rss": rss}))
""")


def bench_llama(args, prompts):
    if not LLAMA_PY.exists():
        return None
    r = subprocess.run([str(LLAMA_PY), "-c", LLAMA_SCRIPT, str(DENSE), str(args.threads), str(args.runs),
                        str(args.gen), json.dumps(prompts)], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--model", type=Path, default=MOE,
                    help="our engine's model (default: the default MoE; llama.cpp runs only beside it)")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    prompts = cut_to_tokens(prompts_text([1400] * 4), args.prompt_tokens, args.model)
    args.prompt_tokens = statistics.median(len(tokens_of(p, args.model)) for p in prompts)
    eb = expert_bytes(args.model)
    quarter = max(1, eb // 4 // (1 << 20))
    ours = bench_ours(args, {}, prompts)
    low = bench_ours(args, {"EXPERT_RAM_MB": str(quarter)}, prompts)
    serving_rss = {k: rss_serving(args, slots=k) for k in (1, 8, 16)}
    llama = bench_llama(args, prompts) if args.model == MOE else None
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")

    def f(x, d=1):
        return "n/a" if x is None else f"{x:.{d}f}"

    L = llama or {}
    print(f"\n{cpu}, {args.threads} threads, commit {commit}; medians of {args.runs} runs; prompt "
          f"{args.prompt_tokens} tokens, {args.gen} generated, greedy. Ours: {args.model.name} "
          f"(routed experts {eb / 2**20:.1f} MiB); llama.cpp: llama-cpp-python "
          f"0.3.16 on the dense Q4_1 source.\n")
    print("| ratio | value |\n|---|---|")
    if llama:
        print(f"| prefill, ours / llama.cpp | {ours['prefill'] / L['prefill']:.2f} |")
        print(f"| decode, ours / llama.cpp | {ours['decode'] / L['decode']:.2f} |")
    print(f"| 8-slot aggregate / single stream (ours) | {ours[8] / ours['decode']:.2f} |")
    print(f"| decode with EXPERT_RAM_MB={quarter} / all in RAM | {low['decode'] / ours['decode']:.2f} |")
    print(f"\nPeak RSS of a fresh engine serving 1 / 8 / 16 conversations at once (KV_SLOTS=n, CTX 4096, "
          f"{args.prompt_tokens:.0f}+{args.gen} tokens each): "
          + " / ".join(f"{v:.0f}" for v in serving_rss.values())
          + " MB. The table's RSS column is the 64-slot benchmark process, which holds the KV of every run.")
    print()
    print("| engine | prefill tok/s | decode tok/s | 4 slots tok/s | 8 slots tok/s | 16 slots tok/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for name, r in (("colibri-engine, MoE, all experts in RAM", ours),
                    (f"colibri-engine, MoE, EXPERT_RAM_MB={quarter} (1/4)", low)):
        print(f"| {name} | {f(r['prefill'])} | {f(r['decode'])} | {f(r[4])} | {f(r[8])} | {f(r[16])} | {f(r['rss'], 0)} |")
    print(f"| llama.cpp (llama-cpp-python 0.3.16), dense Q4_1 | {f(L.get('prefill'))} | {f(L.get('decode'))} "
          f"| n/a | n/a | n/a | {f(L.get('rss'), 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
