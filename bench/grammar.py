#!/usr/bin/env python3
"""Constrained-decoding benchmark (not a test): decode tok/s of our engine with and without a
grammar (SUBMIT ... grammar=1, native/src/grammar.h), same prompt, same budget, greedy.

    .venv/bin/python bench/grammar.py [--model models/smollm2-135m-moe16.gguf] [--runs 5] [--gen 128]

Decode tok/s of a run = (DATA frames - 1) / (time of the last DATA - time of the first DATA):
the steady state, prefill excluded; a constrained run of n tokens is compared with the first n
tokens of the unconstrained runs (the same positions: later tokens cost more). Each grammar run is a fresh request, so its per-state masks
are computed anew inside the measured window (the memo lives per request). Grammars: a JSON
Schema with one free string (many tokens allowed: the trie walk's worst case) and json_object.
Prints medians of --runs runs and the ratio of per-token time constrained / unconstrained
(issue 25's target: <= 1.3). Without the default model (native/tools/build_default_model.py),
--model may name the tiny fixture model (tests/support/procs.make_tiny_model).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine_bridge.grammar import compile_node, grammar_for_json_object, grammar_for_schema  # noqa: E402

READY = b"\x01\x01READY\x01\x01\n"
PROMPT = ("<|im_start|>user\nWrite a long story about a lighthouse keeper as a JSON object with a "
          "\"story\" field.<|im_end|>\n<|im_start|>assistant\n")
SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 40},
                                           "story": {"type": "string"}}, "required": ["title", "story"]}
# a counted string: every character position is its own DFA state, so every step computes a mask
LONG = {"type": "object", "properties": {"story": {"type": "string", "minLength": 200, "maxLength": 256}},
        "required": ["story"]}


class Engine:
    def __init__(self, model: Path, threads: int | None):
        env = dict(os.environ, SERVE="1", SERVE_BATCH="1", SNAP=str(model), KV_SLOTS="1", CTX="2048",
                   KVSAVE="0", USAGE_SAVE="0", COLI_NO_OMP_TUNE="1")
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.p = subprocess.Popen([str(ROOT / "native/build/colibri-engine")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        while self.p.stdout.readline() != READY:
            pass
        self.cond = threading.Condition()
        self.data: dict[int, list[float]] = {}
        self.done: dict[int, list[str]] = {}
        self.next_id = 1
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        f = self.p.stdout
        while line := f.readline():
            t = time.perf_counter()
            parts = line.decode("utf-8", "replace").split()
            if parts and parts[0] == "DATA":
                f.read(int(parts[2]) + 1)
                with self.cond:
                    self.data.setdefault(int(parts[1]), []).append(t)
            elif parts and (parts[0] == "DONE" or (parts[0] == "ERROR" and parts[1] != "0")):
                with self.cond:
                    self.done[int(parts[1])] = parts
                    self.cond.notify_all()

    def run(self, gen: int, grammar: bytes | None) -> list[float]:
        """One greedy request; the arrival times of its DATA frames."""
        rid, self.next_id = self.next_id, self.next_id + 1
        payload = PROMPT.encode()
        extra = f" {len(grammar)} grammar=1" if grammar else ""
        frame = f"SUBMIT {rid} 0 {len(payload)} {gen} 0 1{extra}\n".encode() + payload + (grammar or b"") + b"\n"
        self.p.stdin.write(frame)
        self.p.stdin.flush()
        with self.cond:
            self.cond.wait_for(lambda: rid in self.done, timeout=600)
        assert self.done[rid][0] == "DONE", self.done[rid]
        return self.data.get(rid, [])

    def close(self):
        self.p.stdin.close()
        self.p.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=ROOT / "models/smollm2-135m-moe16.gguf")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if not args.model.exists():
        sys.exit(f"{args.model} missing: build it (native/tools/build_default_model.py) or pass --model")
    cases = {"none": None, "schema (free string)": grammar_for_schema(SCHEMA), "json_object": grammar_for_json_object(),
             "schema (story minLength 200)": grammar_for_schema(LONG),
             # one accepting state taking every byte: the same tokens as "none", so what remains
             # is the machinery's own cost (mask, masked sampling, advancing)
             "every byte (overhead only)": compile_node(("rep", ("set", [(0, 255)]), 0, None))}
    eng = Engine(args.model, args.threads)
    eng.run(8, None)  # warm up (page cache, thread pool)
    results = {name: [] for name in cases}
    for _ in range(args.runs):  # interleaved, so a load change on the host hits every case alike
        for name, g in cases.items():
            results[name].append(eng.run(args.gen, g))
    eng.close()
    print(f"model {args.model.name}, {args.runs} runs, up to {args.gen} tokens, greedy, 1 slot")
    print("| grammar | tokens | decode tok/s | same tokens unconstrained | ms per token over none | ratio |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        if name == "none":
            continue
        n = int(statistics.median(len(ts) for ts in runs))
        # the same positions of the unconstrained runs: later tokens cost more (attention), so a
        # short constrained reply must not be compared with a long free one
        tps = statistics.median(tok_s(ts) for ts in runs)
        base = statistics.median(tok_s(ts[:n]) for ts in results["none"])
        print(f"| {name} | {n} | {tps:.1f} | {base:.1f} | {1000 / tps - 1000 / base:+.2f} | {base / tps:.3f}x |")


def tok_s(ts: list[float]) -> float:
    """Steady-state decode tok/s of a run's DATA times (prefill excluded)."""
    return (len(ts) - 1) / (ts[-1] - ts[0]) if len(ts) > 2 else float("nan")

if __name__ == "__main__":
    main()
