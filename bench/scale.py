#!/usr/bin/env python3
"""Scale benchmark (issue 23 item 5; a benchmark, not a test): our engine and llama.cpp on the same
big MoE file (native/tools/make_qwen3moe_30b.py: Qwen3-30B-A3B's shapes at Q4_K_M), one sitting,
cold page cache before every run, under no cap and under cgroup v1 memory caps.

    bench/scale.py --file /work/big/q30b-L48.gguf [--file skew=/work/big/q30b-L48-skew.gguf]
                   [--caps none,8,4,3] [--engines ours,llama] [--runs 3] [--tokens 32]
                   [--prompt-tokens 100] [--slots8] [--warm] [--disk] [--expert-ram 4=2560,3=1536]
                   [--llama-python bench/.venv-llama/bin/python] [--threads 2] [--engine BIN]
                   [--interleave] [--dram-each-run] [--disk-each-run]

Per (file, engine, cap) the median of --runs runs (spread min–max for decode), each run a fresh
process after `sync; echo 3 > /proc/sys/vm/drop_caches` (if that file cannot be written the script
says so and calls posix_fadvise(DONTNEED) on the model file instead), inside a child cgroup of the
v1 memory controller (/sys/fs/cgroup/memory/colibri-scale-*: memory.limit_in_bytes = the cap, or no
limit for "none"; the process's pid goes into cgroup.procs before it executes the engine; its limit
counts page cache).

Columns:
* decode tok/s: ours = (DATA frames − 1) / (last DATA − first DATA) of one greedy request (mux
  protocol, SERVE=1 SERVE_BATCH=1); llama.cpp = tokens / time of eval([token]) one at a time with
  argmax of its logits (llama-cpp-python, default mmap, use_extra_bufts off).
* prefill tok/s: prompt tokens / time to first token; TTFT: SUBMIT -> first DATA (ours), eval(prompt)
  + argmax (llama.cpp), after the model has loaded (load s: process start -> READY / Llama()).
* peak GiB: the cgroup's memory.max_usage_in_bytes (page cache included).
* disk MB/tok: the process's /proc/<pid>/io read_bytes (bytes it made the block layer read: preads
  and mmap faults alike) over the decode window ÷ tokens; ideal MB/tok: the routed experts' bytes of
  one token (top-k per layer × that layer's gate + up + down slice, file bytes): what an engine that
  caches nothing must read. hit %: our DONE line's expert-cache hit rate (llama.cpp: n/a; it does not
  report one). top-¼: share of the request's expert picks (ROUTES, prompt + generated) taken by
  each layer's 32 most-picked experts, mean over layers (ours only).
* result: ok, or OOM (the cgroup's memory.oom_control oom_kill counter moved or the process died of
  SIGKILL), or the exit status.
* ours under a cap runs with EXPERT_RAM_MB = the --expert-ram value for that cap, else cap − the
  file's non-expert bytes − 768 MB (PIN_MB = EXPERT_RAM_MB, the engine's default); with
  --auto-budget it sets none: the engine sizes itself from the cgroup's limit (native/README.md
  "Memory budget"), and the column shows "auto" and the expert cache its MODEL line reports.

--spec D (with --spec-accept 0.7): after each cap's rows, speculative decoding rows of ours
(spec_rows): a recording run, then per round plain, the verify path (every step drafts D tokens
from the recording, a 1 − accept share corrupted) and the policy (adaptive, every draft wrong),
each a fresh engine on a cold cache; the table gives decode, each ÷ the plain run of its round,
the acceptance and the expert bytes read per token by drafting and by plain steps.

--long-prompts 1000,4000: after each cap's rows, rows of ours with prompts of those lengths (--runs
runs each, CTX large enough): time to first token, prefill tok/s, decode after the long prompt, peak,
and the TTFT bound = the time to read the experts the prompt touches (a long prompt touches nearly
every expert: the file's expert bytes less the expert cache the engine reports, at the disk's
O_DIRECT rate measured after the cap's runs, 4 lanes) + the prompt at the uncapped row's prefill
rate for that length (the "none" cap must come first in --caps); TTFT ÷ bound is the last column.

--warm: under each cap (and uncapped with --auto-budget: a file larger than RAM), a row "ours, warm
start": a priming run on another text writes a usage file (the engine saves one at exit by default),
then --runs runs of the same prompt load it (pinned from the start), each from a cold page cache. The cold rows read no usage file (USAGE_FILE=/dev/null).
--interleave: the engines alternate run by run (ours, llama.cpp, ours, ...) instead of one engine's
runs after the other's, and a table sets each run of ours against the llama.cpp run right after it:
the VM's DRAM bandwidth drifts by a third within minutes, ours follows it (bandwidth-bound) and
llama.cpp much less, so grouped runs can compare a good minute of one with a bad minute of the other.
--disk-each-run: each capped run of ours between two 3 s disk readings (O_DIRECT reads of the file's
own expert slices, 4 lanes = IO_LANES), its bound from their mean and its own hit rate, and a table of each run's
decode against it: the VM's disk drifts (1.5-2.2 GB/s within minutes on 2026-12-05), so a reading
taken once per cap, after its runs, sets a run against a minute it did not see.
--slots8: 8 concurrent conversations at full RAM (ours, KV_SLOTS=8, 8 SUBMITs at once to 8 slots,
aggregate tok/s between the moment every stream has started and the first DONE).
--disk: per capped row of ours, the disk bound as measured right after that cap's runs (4 lanes,
3 s; the last column: bound tok/s at that bandwidth and the share of it the row's decode reached); and
at the end O_DIRECT reads of the file's expert slices (a random expert of a random expert matrix,
as a miss reads them) with 1, 2 and 4 lanes (threads; 4 = the engine's IO_LANES default), and the decode bound they imply (bandwidth ÷ routed
bytes per token, nothing cached; and with the hit rate measured in the runs); and the DRAM bound
(bandwidth of a numpy float32 sum over a 2 GiB buffer, --threads threads, best of 3 ÷ the bytes a token reads: every non-expert
matrix but the embedding, plus top-k of each layer's experts).

llama.cpp: llama-cpp-python built from source (see bench/engine.py), any venv (--llama-python).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import engine  # noqa: E402  (bench/engine.py: the mux driver)
import llama_child  # noqa: E402  (the llama.cpp child scripts' prelude)
CG_ROOT = Path("/sys/fs/cgroup/memory")


# ------------------------------------------------------------------ model facts from the GGUF
def model_facts(path):
    from gguf import GGUFReader
    r = GGUFReader(str(path))
    f = {fl.name: fl for fl in r.fields.values()}

    def scalar(k, default=None):
        if k not in f:
            return default
        return int(f[k].parts[f[k].data[0]][0])

    arch = bytes(f["general.architecture"].parts[-1]).decode()
    top_k, n_exp = scalar(f"{arch}.expert_used_count"), scalar(f"{arch}.expert_count")
    routed = dense = expert_total = 0
    slices = []     # (offset, bytes of one expert's slice) of every expert matrix: what a miss reads
    for t in r.tensors:
        nb = int(t.n_bytes)
        if "_exps." in t.name:
            expert_total += nb
            routed += nb * top_k // n_exp
            if t.name.endswith("_exps.weight"):
                slices.append((int(t.data_offset), nb // n_exp))
        elif t.name != "token_embd.weight":
            dense += nb
    embd = next(int(t.n_bytes) for t in r.tensors if t.name == "token_embd.weight")
    return dict(arch=arch, layers=scalar(f"{arch}.block_count"), top_k=top_k, n_exp=n_exp,
                mtp=scalar(f"{arch}.nextn_predict_layers", 0),
                routed_per_tok=routed, dense_per_tok=dense, nonexpert=dense + embd, expert_total=expert_total,
                slices=slices, size=os.path.getsize(path))


# ------------------------------------------------------------------ cache and cgroups
DROP_OK = None


def mem_available():
    with open("/proc/meminfo") as fh:
        return next(int(ln.split()[1]) * 1024 for ln in fh if ln.startswith("MemAvailable:"))


def settle_memory(limit_s=30.0):
    """Waits (up to limit_s) until MemAvailable stops rising: the last engine's memory is still
    being returned for a few seconds after it exits, and an engine sizing its budget from
    MemAvailable in that window would stream a model that fits (a "full RAM" run that is not)."""
    t0, last = time.time(), mem_available()
    while time.time() - t0 < limit_s:
        time.sleep(1.0)
        now = mem_available()
        if now - last < 32 << 20:
            return
        last = now


def cold_cache(path):
    """Drops the page cache (falls back to fadvise DONTNEED on the file), once the memory of the
    last run is back."""
    global DROP_OK
    settle_memory()
    os.sync()
    if DROP_OK is not False:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as fh:
                fh.write("3\n")
            DROP_OK = True
            return
        except OSError as e:
            DROP_OK = False
            print(f"# drop_caches not writable ({e}); using posix_fadvise(DONTNEED) on the file", file=sys.stderr)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Cgroup:
    def __init__(self, name, limit_bytes):
        self.dir = CG_ROOT / f"colibri-scale-{name}-{os.getpid()}"
        if self.dir.exists():
            self.dir.rmdir()
        self.dir.mkdir()
        if limit_bytes:
            (self.dir / "memory.limit_in_bytes").write_text(str(int(limit_bytes)))
        self.oom0 = self.oom_kills()

    def oom_kills(self):
        for ln in (self.dir / "memory.oom_control").read_text().splitlines():
            if ln.startswith("oom_kill "):
                return int(ln.split()[1])
        return 0

    def enter_fn(self):
        procs = str(self.dir / "cgroup.procs")

        def fn():
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        return fn

    def peak(self):
        return int((self.dir / "memory.max_usage_in_bytes").read_text())

    def oomed(self):
        return self.oom_kills() > self.oom0

    def stat(self):
        """memory.stat's total_rss / total_cache / total_mapped_file now (bytes): where the peak goes."""
        want = ("total_rss", "total_cache", "total_mapped_file")
        return {k: int(v) for k, v in (ln.split() for ln in (self.dir / "memory.stat").read_text().splitlines())
                if k in want}

    def remove(self):
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def smaps_field(pid, name):
    """A /proc/<pid>/smaps_rollup field in bytes (AnonHugePages: memory backed by huge pages)."""
    try:
        for ln in open(f"/proc/{pid}/smaps_rollup"):
            if ln.startswith(name + ":"):
                return int(ln.split()[1]) * 1024
    except OSError:
        return None
    return None


def read_bytes(pid):
    try:
        for ln in open(f"/proc/{pid}/io"):
            if ln.startswith("read_bytes:"):
                return int(ln.split()[1])
    except OSError:
        pass
    return None


# ------------------------------------------------------------------ ours (mux)
class Mux(engine.Mux):
    """bench/engine.py's mux driver, inside a cgroup, with what this benchmark reads: the
    process's read_bytes at every DATA, the PERF / ROUTES lines per request, TIERS, stderr."""

    def __init__(self, env, cg, timeout):
        self.io, self.lines, self.err = {}, {}, bytearray()
        super().__init__(env, stderr=subprocess.PIPE, preexec_fn=cg.enter_fn(), ready_timeout=timeout)

    def started(self):
        self.err_reader = threading.Thread(target=self._err, daemon=True)
        self.err_reader.start()

    def exit_detail(self):
        self.err_reader.join(5)  # the engine has closed stdout: its last stderr lines are on the way
        return ": " + self.err.decode(errors="replace")[-500:]

    def _err(self):
        for ln in self.p.stderr:
            self.err += ln

    def on_data(self, rid, t):
        self.io.setdefault(rid, []).append(read_bytes(self.p.pid))

    def on_line(self, kind, parts, t):
        if kind in ("PERF", "ROUTES", "SPEC"):
            self.lines.setdefault(int(parts[1]), {})[kind] = parts
        elif kind == "TIERS":
            self.lines.setdefault(0, {})["TIERS"] = parts
        elif kind == "MODEL":   # its memory split (a flat object: no spaces, no nesting)
            found = re.search(r'"memory":(\{[^{}]*\})', " ".join(parts[1:]))
            self.lines.setdefault(0, {})["memory"] = json.loads(found.group(1)) if found else None

    def run(self, prompts, max_tokens, timeout):
        """One request per prompt, prompt i on slot i, with routes=1 (the top-¼ column)."""
        return super().run(prompts, range(len(prompts)), max_tokens, options="routes=1", timeout=timeout, check=False)


def top_quarter(routes, n_exp):
    """Mean over layers of the share of picks taken by the 32 (n/4) most-picked experts."""
    if not routes or len(routes) < 4:
        return None
    rows = int(routes[2])
    c = np.zeros((rows, n_exp))
    for tri in routes[4:]:
        r, e, n = map(int, tri.split(":"))
        c[r, e] = n
    s = np.sort(c, axis=1)[:, ::-1]
    tot = s.sum(axis=1)
    ok = tot > 0
    return float((s[ok, : n_exp // 4].sum(axis=1) / tot[ok]).mean()) if ok.any() else None


def run_ours(a, path, facts, cap_gb, prompt, label, usage=None, extra_env=None):
    """One greedy request on a fresh engine. usage: (USAGE_FILE, save?) — the warm-start rows load
    the usage file an earlier run wrote (the engine's default: <model>.coli_usage, saved at exit);
    otherwise no history is read or written. extra_env: more settings (the SPEC_* rows)."""
    ctx = max(2048, 1 << (int(len(prompt) / 2.0) + a.tokens + 64).bit_length())   # ~2.3 bytes a token
    env = dict(os.environ, SERVE="1", SERVE_BATCH="1", SNAP=str(path), KV_SLOTS="1", CTX=str(ctx),
               USAGE_SAVE="0", KVSAVE="0", OMP_NUM_THREADS=str(a.threads))
    env["USAGE_FILE"] = usage[0] if usage else os.devnull
    if usage and usage[1]:
        env["USAGE_SAVE"] = "1"
    env.pop("EXPERT_RAM_MB", None)
    env.pop("MEM_BUDGET_MB", None)
    if not cap_gb and a.full_budget_mb:
        env["MEM_BUDGET_MB"] = str(a.full_budget_mb)
    env.update(extra_env or {})
    ram_mb = None
    if cap_gb and not a.auto_budget:
        ram_mb = a.expert_ram.get(cap_gb)
        if ram_mb is None:
            ram_mb = max(64, int(cap_gb * 1024 - facts["nonexpert"] / 2**20 - 768))
        env["EXPERT_RAM_MB"] = str(ram_mb)
    cold_cache(path)
    cg = Cgroup(label, int(cap_gb * 2**30) if cap_gb else None)
    out = dict(engine="ours", cap=cap_gb, expert_ram_mb=ram_mb)
    m = None
    try:
        m = Mux(env, cg, a.timeout)
        out["load_s"] = m.t_ready - m.t_start
        mem = m.lines.get(0, {}).get("memory")
        if mem:
            out["memory"] = mem
            if cap_gb and a.auto_budget:
                out["expert_ram_mb"] = f"auto {mem['experts_mb']:.0f}"
        t0, ids = m.run([prompt], a.tokens, a.timeout)
        rid = ids[0]
        d, io = m.data.get(rid, []), m.io.get(rid, [])
        done = m.done.get(rid)
        if done and done[1][0] == "DONE" and len(d) >= 2:
            st = done[1]
            ptok = int(st[7])
            out.update(result="ok", prompt_tokens=ptok, ttft=d[0] - t0, prefill=ptok / (d[0] - t0),
                       decode=(len(d) - 1) / (d[-1] - d[0]), hit=float(st[5]), tokens=len(d))
            if io[0] is not None and io[-1] is not None:
                out["disk_per_tok"] = (io[-1] - io[0]) / (len(d) - 1)
            out["top_quarter"] = top_quarter(m.lines.get(rid, {}).get("ROUTES"), facts["n_exp"])
            spec = m.lines.get(rid, {}).get("SPEC")
            if spec:    # SPEC id steps drafted accepted emitted ms/tok plain_steps ms/tok MB/tok MB/tok
                out["spec"] = dict(steps=int(spec[2]), drafted=int(spec[3]), accepted=int(spec[4]),
                                   emitted=int(spec[5]), plain_steps=int(spec[7]),
                                   mb_draft=float(spec[9]), mb_plain=float(spec[10]),
                                   guesses=int(spec[11]), guesses_right=int(spec[12]))
            perf = m.lines.get(rid, {}).get("PERF")
            if perf:
                out["t_edisk"] = float(perf[3])
            tiers = m.lines.get(0, {}).get("TIERS")
            if tiers:
                out["ram_experts"] = int(tiers[2])
            out["mem_after_decode"] = cg.stat()
            out["anon_huge"] = smaps_field(m.p.pid, "AnonHugePages")
        else:
            out["result"] = "failed: " + (" ".join(done[1]) if done else "no DONE")
    except Exception as e:  # noqa: BLE001
        out["result"] = f"failed: {e}"
    finally:
        rc = m.close() if m else None
        if m is None or (out.get("result") != "ok"):
            rc = rc if rc is not None else -1
        out["rc"] = rc
        out["peak"] = cg.peak()
        if cg.oomed() or rc == -signal.SIGKILL:
            out["result"] = "OOM (killed)"
        elif out.get("result") == "ok" and rc not in (0, None):
            out["result"] = f"exit {rc}"
        if m is not None:
            out["stderr_tail"] = m.err.decode(errors="replace")[-300:]
        cg.remove()
    return out


def run_ours_slots(a, path, prompts, label):
    env = dict(os.environ, SERVE="1", SERVE_BATCH="1", SNAP=str(path), KV_SLOTS=str(len(prompts)), CTX="2048",
               USAGE_SAVE="0", KVSAVE="0", OMP_NUM_THREADS=str(a.threads))
    env.pop("EXPERT_RAM_MB", None)
    cold_cache(path)
    cg = Cgroup(label, None)
    out = dict(engine="ours", slots=len(prompts))
    m = None
    try:
        m = Mux(env, cg, a.timeout)
        t0, ids = m.run(prompts, a.tokens, a.timeout)
        if all(i in m.done and m.done[i][1][0] == "DONE" for i in ids):
            start = max(m.data[i][0] for i in ids)
            end = min(m.done[i][0] for i in ids)
            n = sum(sum(1 for t in m.data[i] if start < t <= end) for i in ids)
            out.update(result="ok", aggregate=n / (end - start) if end > start else float("nan"))
        else:
            out["result"] = "failed"
    finally:
        rc = m.close() if m else -1
        out["peak"] = cg.peak()
        if cg.oomed() or rc == -signal.SIGKILL:
            out["result"] = "OOM (killed)"
        cg.remove()
    return out


def row_bound(a, path, facts, s, bw_now):
    """The disk bound of a capped row of ours, from the disk as it is now: the VM's disk drifts
    (1.8–2.7 GB/s within one sitting), so one measurement per sitting made the ratio swing. The
    reads (IO_LANES lanes, the engine's default 4) are measured after the row's runs, once per cap;
    bound = bandwidth ÷ (routed bytes per token × (1 − hit)), what an engine that overlaps every
    read with compute and reads nothing it does not use would reach."""
    if not a.disk or s.get("engine", "").startswith("llama"):
        return
    if "bw" not in bw_now:
        bw_now["bw"] = disk_now(path, facts)
    miss = facts["routed_per_tok"] * (1 - s["hit"] / 100)
    s["disk_bw"] = bw_now["bw"]
    s["bound"] = bw_now["bw"] / miss if miss > 0 else None


def log_run(tag, r, rec):
    """One run's record: a summary line on stderr (floats rounded, no stderr tail) and, with
    --json, the whole record appended as a JSON line."""
    print(f"#   {tag}: " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v)
                                     for k, v in r.items() if k != "stderr_tail"}), file=sys.stderr, flush=True)
    if rec:
        rec.write(json.dumps(r) + "\n")
        rec.flush()


def long_rows(a, path, facts, cap_gb, label, rec, full_prefill):
    """--long-prompts: rows of ours with prompts of those lengths under this cap (see the docstring
    for the TTFT bound); full_prefill[n]: the uncapped row's prefill tok/s, filled by cap none."""
    out = []
    bw = disk_now(path, facts) if cap_gb else None
    for n in a.long_prompts:
        rows = []
        for i in range(a.runs):
            r = run_ours(a, path, facts, cap_gb, prompt_text(n, 40000), f"{label}-long{n}-{i}")
            r.update(run=i, long=n)
            log_run(f"{label}-long{n}-{i}", r, rec)
            rows.append(r)
        s = summarize(rows)
        ok = [r for r in rows if r.get("result") == "ok"]
        s.update(cap=cap_gb, long=n, prompt_tokens=ok[0]["prompt_tokens"] if ok else None,
                 memory=ok[0].get("memory") if ok else None)
        if not cap_gb and s.get("prefill"):
            full_prefill[n] = s["prefill"]
        if cap_gb and ok and s["memory"] and full_prefill.get(n) and bw:
            uncached = max(0.0, facts["expert_total"] - s["memory"]["experts_mb"] * 2**20)
            s.update(read_s=uncached / bw, compute_s=s["prompt_tokens"] / full_prefill[n], disk_bw=bw)
            s["ttft_bound"] = s["read_s"] + s["compute_s"]
        out.append(s)
    return out


def long_table(rows, facts_of):
    if not rows:
        return
    print()
    print("| file | cap | prompt tokens | result | TTFT s (median) | prefill tok/s | TTFT bound s (read + compute) | "
          "TTFT ÷ bound | decode tok/s after it | peak GiB (cgroup) | budget: experts / KV / work MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in rows:
        mem = s.get("memory") or {}
        bound = ("–" if s.get("ttft_bound") is None else
                 f"{s['ttft_bound']:.1f} ({s['read_s']:.1f} + {s['compute_s']:.1f}; disk {s['disk_bw'] / 1e9:.2f} GB/s)")
        ratio = "–" if s.get("ttft_bound") is None or s.get("ttft") is None else f"{s['ttft'] / s['ttft_bound']:.2f}"
        split = "–" if not mem else f"{mem['experts_mb']:.0f} / {mem['kv_mb']:.0f} / {mem['work_mb']:.0f}"
        print(f"| {s['file']} | {'none' if not s['cap'] else format(s['cap'], 'g') + ' GB'} | {s.get('prompt_tokens') or '–'} | "
              f"{s['result']} | {fmt(s.get('ttft'), '.1f')} | {fmt(s.get('prefill'), '.1f')} | {bound} | {ratio} | "
              f"{fmt(s.get('decode'))} | {s['peak'] / 2**30:.2f} | {split} |")


def warm_rows(a, path, facts, cap_gb, prompt, label, rec):
    """The warm-start row: what a returning user gets. One priming run on another text writes the
    usage file (as every engine run does by default at exit), then --runs runs measure the same
    prompt as the cold rows with that history loaded (pinned at start), each from a cold page cache."""
    usage = Path(f"/tmp/colibri-scale-{label}.coli_usage")
    usage.unlink(missing_ok=True)
    prime = run_ours(a, path, facts, cap_gb, prompt_text(a.prompt_tokens, 60000), f"{label}-prime", usage=(str(usage), True))
    print(f"#   {label}-prime: result {prime.get('result')}, usage file {usage.stat().st_size if usage.exists() else 0} B",
          file=sys.stderr, flush=True)
    rows = []
    for i in range(a.runs):
        r = run_ours(a, path, facts, cap_gb, prompt, f"{label}-{i}", usage=(str(usage), False))
        r.update(file=label, path=str(path), run=i, warm=True)
        log_run(f"{label}-{i}", r, rec)
        rows.append(r)
    usage.unlink(missing_ok=True)
    s = summarize(rows)
    s["n"] = len(rows)
    return s


# ------------------------------------------------------------------ llama.cpp
# t_start before the imports: load s counts importing llama_cpp, as the engine's counts its start.
LLAMA_SCRIPT = "import time\nt_start = time.perf_counter()\n" + llama_child.PRELUDE + textwrap.dedent("""
    import json, sys
    import numpy as np
    from llama_cpp import Llama
    def rb():
        for ln in open("/proc/self/io"):
            if ln.startswith("read_bytes:"):
                return int(ln.split()[1])
    model, threads, n, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    llm = Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=256, verbose=False)
    t_loaded = time.perf_counter()
    toks = llm.tokenize(prompt.encode(), add_bos=False)
    nv = llm.n_vocab()
    def argmax():   # 0.3.36 keeps llm.scores only with logits_all; read the context's last row
        return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(nv,)).argmax())
    t0 = time.perf_counter()
    llm.eval(toks)
    tok = argmax()
    t1 = time.perf_counter()
    r1 = rb()
    k = 0
    for _ in range(n - 1):
        llm.eval([tok])
        tok = argmax()
        k += 1
    t2 = time.perf_counter()
    r2 = rb()
    print(json.dumps(dict(load_s=t_loaded - t_start, prompt_tokens=len(toks), ttft=t1 - t0,
                          prefill=len(toks) / (t1 - t0), decode=k / (t2 - t1), tokens=k + 1,
                          disk_per_tok=(r2 - r1) / max(k, 1))))
""")


def run_llama(a, path, facts, cap_gb, prompt, label):
    cold_cache(path)
    cg = Cgroup(label, int(cap_gb * 2**30) if cap_gb else None)
    out = dict(engine="llama.cpp", cap=cap_gb)
    try:
        p = subprocess.run([a.llama_python, "-c", LLAMA_SCRIPT, str(path), str(a.threads), str(a.tokens), prompt],
                           capture_output=True, text=True, timeout=a.timeout, preexec_fn=cg.enter_fn())
        rc = p.returncode
        if rc == 0:
            out.update(json.loads(p.stdout.strip().splitlines()[-1]))
            out["result"] = "ok"
        else:
            out["result"] = f"exit {rc}"
            out["stderr_tail"] = p.stderr[-300:]
    except subprocess.TimeoutExpired:
        rc = None
        out["result"] = f"timeout ({a.timeout} s)"
    out["rc"] = rc
    out["peak"] = cg.peak()
    if cg.oomed() or rc == -signal.SIGKILL:
        out["result"] = "OOM (killed)"
    cg.remove()
    return out


# ------------------------------------------------------------------ disk and DRAM
HUGE_PAGE = 2 << 20
READ_CHUNK = 1 << 20      # native/src/experts.c READ_CHUNK


def disk_bw(path, slices, n_exp, lanes, seconds=4.0):
    """O_DIRECT reads of the file's own expert slices, `lanes` threads: each read one expert's
    slice of a random expert matrix (gate, up or down of any layer), as a miss is, through its
    page-aligned cover, as the engine reads it (native/src/experts.c read_cover). The slice's size
    is the file's (until 2026-12-07 one fixed size, 884,736 B, at 4 KiB-aligned offsets: on a Zen 3
    VM that day, 1.00-1.10x this probe's rate on the 35B-A3B-shaped file's 0.59 / 0.86 MB slices
    and 1.00-1.10x on the gpt-oss-20b file's 4.4 MB ones, alternated 3 s readings). Each lane reads into a private
    anonymous buffer on a 2 MiB boundary, advised MADV_HUGEPAGE, as the engine's buffers are
    (native/src/mem.c): on a VM, reads into 4 KiB pages (Python's default shared mapping) ran at
    half the device's rate, 2.0-2.4 against 4.4-4.8 GB/s on 2026-12-06, and a bound read that
    way was the buffer's, not the disk's. A cover is read in READ_CHUNK pieces, as the engine reads
    a slice kept in the file's layout (MXFP4 under a budget; a packed slice, read whole, is at most
    one piece in the files benched here but Qwen3-30B's Q6_K down, 1.3 MB): on a VM's virtio disk
    1 MiB random reads ran at ~3.0 GB/s where whole 4.4 MB slices ran at 2.5-2.6 (2026-12-07).
    Returns the slices' bytes per second (the covers' extra pages are not counted: the bound
    divides what a token needs by this)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    total = [0] * lanes
    stop = time.perf_counter() + seconds
    cover = max(-(-(sz + 2 * 4096) // 4096) * 4096 for _, sz in slices)

    def lane(i):
        n = -(-cover // HUGE_PAGE) * HUGE_PAGE
        raw = mmap.mmap(-1, n + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw.madvise(mmap.MADV_HUGEPAGE)
        at = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % HUGE_PAGE
        rnd = random.Random(1000 + i)
        while time.perf_counter() < stop:
            base, sz = slices[rnd.randrange(len(slices))]
            off = base + rnd.randrange(n_exp) * sz
            a0, a1 = off & ~4095, -(-(off + sz) // 4096) * 4096
            got = 0
            for c0 in range(a0, a1, READ_CHUNK):
                c1 = min(a1, c0 + READ_CHUNK)
                buf = memoryview(raw)[at + c0 - a0:at + c1 - a0]
                got += os.preadv(fd, [buf], c0)
                buf.release()
            if got >= off - a0 + sz:
                total[i] += sz

    t0 = time.perf_counter()
    th = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    return sum(total) / dt


def dram_bw(threads=2, gib=2.0, reps=3):
    a = np.ones(int(gib * 2**30) // 4, dtype=np.float32)   # 4x this host's 480 MiB L3
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(reps):
        t0 = time.perf_counter()
        th = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        for t in th:
            t.start()
        for t in th:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0))
    del a, parts
    return best


def disk_now(path, facts):
    """The disk's expert-read bandwidth of this moment (--disk-each-run): 3 s of expert-sized
    O_DIRECT random reads on 4 lanes, the engine's IO_LANES default."""
    return disk_bw(str(path), facts["slices"], facts["n_exp"], 4, seconds=3.0)


def dram_now(threads=2, readings=3):
    """The DRAM bandwidth of this moment: the median of `readings` single 2 GiB sums. The VM's
    bandwidth drifts from minute to minute (22.8-35.2 GB/s within eight minutes on 2026-12-04), so an
    uncapped run's bound is read just before and just after it (--dram-each-run), not once per
    sitting: the best of a sitting's readings set against a median decode understated the ratio."""
    return statistics.median(dram_bw(threads, reps=1) for _ in range(readings))


# ------------------------------------------------------------------ report
def prompt_text(n_tokens, offset=0):
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics))
    # ~2.3 bytes per token with the generator's pair/triple merges
    n = int(n_tokens * 2.3)
    return text[offset:offset + n]


def bound_cell(s):
    if s.get("bound") is None or s.get("decode") is None:
        return "–"
    return f"{s['bound']:.2f} at {s['disk_bw'] / 1e9:.2f} GB/s ({s['decode'] / s['bound']:.2f}×)"


def fmt(v, spec=".2f"):
    return "n/a" if v is None else format(v, spec)


def summarize(rows):
    ok = [r for r in rows if r.get("result") == "ok"]
    res = rows[0]["result"] if not ok else ("ok" if len(ok) == len(rows) else f"ok {len(ok)}/{len(rows)}")
    if not ok:
        return dict(result=res, peak=max(r["peak"] for r in rows))

    def med(k):
        v = [r[k] for r in ok if r.get(k) is not None]
        return statistics.median(v) if v else None
    dec = [r["decode"] for r in ok]
    return dict(result=res, decode=med("decode"), dmin=min(dec), dmax=max(dec), prefill=med("prefill"), ttft=med("ttft"),
                load=med("load_s"), peak=max(r["peak"] for r in rows), disk=med("disk_per_tok"), hit=med("hit"),
                tq=med("top_quarter"), ram=ok[0].get("expert_ram_mb"), ram_experts=ok[0].get("ram_experts"),
                dram_runs=[r for r in ok if "dram_ratio" in r], disk_runs=[r for r in ok if "disk_ratio" in r])


def spec_rows(a, path, facts, cap, prompt, label, rec):
    """Speculative decoding on this file and cap (--spec D): a recording run (plain, SPEC_RECORD),
    then --runs rounds of fresh engines, cold cache each: plain; the verify path for each count in
    --spec-verify (SPEC_POLICY=always, drafts from the recording with a 1 − --spec-accept share
    corrupted: the acceptance a draft model would have); the policy (adaptive, up to D drafts from
    the file's own MTP block, random in a generated file so never right; a file without one: the
    recording with every draft corrupted): what such a head costs once the engine notices.
    -> one summary dict."""
    replay = Path(tempfile.mkdtemp(prefix="colibri-spec-")) / "record.txt"
    first = run_ours(a, path, facts, cap, prompt, f"{label}-record", extra_env={"SPEC_RECORD": str(replay)})
    verify = [] if a.spec_verify == "none" else [int(d) for d in a.spec_verify.split(",") if d] or [a.spec]
    out: dict = dict(cap=cap, file=label, result=first.get("result"), plain=[], policy=[], verify_drafts=verify,
                     policy_source="MTP block" if facts.get("mtp") else "recording, all wrong",
                     **{f"verify{d}": [] for d in verify})
    if first.get("result") != "ok":
        return out
    kinds: dict = {"plain": {}}
    for d in verify:
        kinds[f"verify{d}"] = {"SPEC_DRAFT": str(d), "SPEC_POLICY": "always", "SPEC_REPLAY": str(replay),
                               "SPEC_CORRUPT": f"{1 - a.spec_accept:g}"}
    kinds["policy"] = ({"SPEC_DRAFT": str(a.spec)} if facts.get("mtp") else
                       {"SPEC_DRAFT": str(a.spec), "SPEC_REPLAY": str(replay), "SPEC_CORRUPT": "1"})
    for i in range(a.runs):
        for kind, env in kinds.items():
            r = run_ours(a, path, facts, cap, prompt, f"{label}-{kind}-{i}", extra_env=env)
            r.update(file=label, run=i, spec_kind=kind)
            log_run(f"{label}-{kind}-{i}", r, rec)
            out[kind].append(r)
    return out


def spec_table(rows):
    if not rows:
        return
    print()
    print("| file | cap | rows | decode tok/s (runs) | ÷ plain of the same round (median; min–max) | "
          "acceptance (kept ÷ drafted) | expert MB read from disk per token, drafting / plain steps | "
          "steps that drafted, of all |")
    print("|---|---|---|---|---|---|---|---|")
    for s in rows:
        kinds = ["plain"] + [f"verify{d}" for d in s["verify_drafts"]] + ["policy"]
        ok = {k: [r for r in s.get(k, []) if r.get("result") == "ok"] for k in kinds}
        dec = {k: [r["decode"] for r in v] for k, v in ok.items()}
        cap_s = "none" if not s["cap"] else f"{s['cap']:g} GB"
        for k in kinds:
            rs = [x / p for x, p in zip(dec[k], dec["plain"])] if k != "plain" else []
            ratio = f"**{statistics.median(rs):.2f}×** ({min(rs):.2f}–{max(rs):.2f})" if rs else "–"
            sp = [r["spec"] for r in ok[k] if r.get("spec")]
            acc = f"{sum(x['accepted'] for x in sp) / max(1, sum(x['drafted'] for x in sp)):.2f}" if sp else "–"
            disk = (", ".join(f"{x['mb_draft']:.0f} / {x['mb_plain']:.0f}" for x in sp) if sp and s["cap"] else "–")
            steps = ", ".join(f"{x['steps']}/{x['steps'] + x['plain_steps']} (lone guesses {x['guesses_right']} "
                              f"of {x['guesses']} right)" for x in sp) if sp else "–"
            name = (f"verify path: {k[6:]} drafts every step, from the recording" if k.startswith("verify") else
                    "plain (no drafting)" if k == "plain" else f"adaptive policy, drafts from the {s['policy_source']}")
            print(f"| {s['file']} | {cap_s} | {name} | {', '.join(f'{x:.2f}' for x in dec[k])} | {ratio} | {acc} | "
                  f"{disk} | {steps} |")


def per_run_table(table, runs_key, ratio_key, ratio_head, lead, cols):
    """The run-by-run table of the rows whose runs were each read against their own moment's bound
    (--dram-each-run: runs_key "dram_runs"; --disk-each-run: "disk_runs"): the row's lead cells,
    its run count, per column one value per run, then the median and spread of the runs' ratio."""
    shown = [s for s in table if s.get(runs_key)]
    if not shown:
        return
    heads = [h for h, _ in lead] + ["runs"] + [h for h, _ in cols] + [ratio_head]
    print()
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * len(heads))
    for s in shown:
        runs = s[runs_key]
        rs = [r[ratio_key] for r in runs]
        cells = [cell(s) for _, cell in lead] + [str(len(runs))]
        cells += [", ".join(cell(r) for r in runs) for _, cell in cols]
        cells.append(f"**{statistics.median(rs):.2f}×** ({min(rs):.2f}–{max(rs):.2f})")
        print("| " + " | ".join(cells) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", action="append", required=True, help="[label=]path; repeatable")
    ap.add_argument("--caps", default="none,8,4,3", help="comma list of GB caps, 'none' = no cap")
    ap.add_argument("--engines", default="ours,llama")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per run")
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--expert-ram", default="", help="cap=MB,... EXPERT_RAM_MB for ours under a cap")
    ap.add_argument("--slots8", action="store_true", help="8 concurrent conversations at full RAM (ours)")
    ap.add_argument("--warm", action="store_true", help="under each cap (uncapped too with --auto-budget), a warm-start row for ours (usage file of a priming run)")
    ap.add_argument("--disk", action="store_true", help="measure O_DIRECT expert reads and DRAM bandwidth")
    ap.add_argument("--interleave", action="store_true",
                    help="alternate the engines run by run (ours, llama.cpp, ours, ...) and print each pair's ratio")
    ap.add_argument("--disk-each-run", action="store_true",
                    help="read the disk bandwidth before and after each capped run of ours (its own bound)")
    ap.add_argument("--dram-each-run", action="store_true",
                    help="read the DRAM bandwidth just before and after each uncapped run of ours: each run's "
                         "decode against its own moment's bound (the table's last section)")
    ap.add_argument("--llama-python", default=str(ROOT / "bench" / ".venv-llama" / "bin" / "python"))
    ap.add_argument("--json", help="append every run's record to this file (JSON lines)")
    ap.add_argument("--auto-budget", action="store_true",
                    help="ours under a cap sets no EXPERT_RAM_MB: the engine sizes itself from the cgroup")
    ap.add_argument("--long-prompts", default="", help="comma list of prompt lengths (tokens) for long-prompt rows of ours")
    ap.add_argument("--engine", default=str(engine.ENGINE), help="our engine's binary (an A/B of two builds)")
    ap.add_argument("--full-budget-mb", type=int, default=0,
                    help="MEM_BUDGET_MB for ours without a cap (a file that fits only without the engine's "
                         "1 GB margin on MemAvailable: its experts resident, as a full-RAM row means)")
    ap.add_argument("--spec", type=int, default=0,
                    help="speculative decoding rows of ours with up to this many drafted tokens a step (1..4)")
    ap.add_argument("--spec-accept", type=float, default=0.7,
                    help="the verify-path rows' share of drafted tokens that are right")
    ap.add_argument("--spec-only", action="store_true", help="only the --spec rows")
    ap.add_argument("--spec-verify", default="",
                    help="comma list of draft counts for the verify-path rows (default: --spec; none: no such rows)")
    a = ap.parse_args(argv)
    engine.ENGINE = Path(a.engine)
    a.expert_ram = {float(k): int(v) for k, v in (kv.split("=") for kv in a.expert_ram.split(",") if kv)}
    caps = [None if c == "none" else float(c) for c in a.caps.split(",") if c]
    a.long_prompts = [int(n) for n in a.long_prompts.split(",") if n]
    long_table_rows = []
    spec_table_rows = []
    engines = a.engines.split(",")
    if "llama" in engines and not Path(a.llama_python).exists():
        print(f"# {a.llama_python} missing: llama.cpp rows skipped", file=sys.stderr)
        engines.remove("llama")
    files = []
    for spec in a.file:
        label, _, p = spec.rpartition("=")
        p = Path(p)
        files.append((label or ("skew" if "skew" in p.name else "uniform"), p))
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"# bench/scale.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}, {os.cpu_count()} CPUs, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB RAM, {a.threads} threads, "
          f"{a.runs} runs, {a.tokens} tokens, ~{a.prompt_tokens}-token prompt")
    prompt = prompt_text(a.prompt_tokens)
    rec = open(a.json, "a") if a.json else None
    facts_of = {}
    table = []
    hits = []
    for label, path in files:
        facts = facts_of[path] = model_facts(path)
        full_prefill = {}
        print(f"# {label}: {path} ({facts['size'] / 2**30:.2f} GiB, {facts['layers']} layers, routed experts "
              f"{facts['routed_per_tok'] / 1e6:.1f} MB/token, a token reads {(facts['routed_per_tok'] + facts['dense_per_tok']) / 1e6:.1f} MB, "
              f"non-expert {facts['nonexpert'] / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
        for cap in caps:
            bw_now = {}
            rows_of = {eng: [] for eng in engines}
            stopped = set()
            # --interleave: ours, llama.cpp, ours, ... so both see the same minutes of the VM
            order = ([(i, eng) for i in range(a.runs) for eng in engines] if a.interleave
                     else [(i, eng) for eng in engines for i in range(a.runs)])
            if a.spec_only:
                order = []
            for i, eng in order:
                if eng in stopped:
                    continue
                rows = rows_of[eng]
                tag = f"{label}-{eng}-{cap or 'none'}-{i}"
                each = a.dram_each_run and eng == "ours" and not cap
                each_disk = a.disk_each_run and eng == "ours" and cap
                before = dram_now(a.threads) if each else None
                disk_before = disk_now(path, facts) if each_disk else None
                r = (run_ours if eng == "ours" else run_llama)(a, path, facts, cap, prompt, tag.replace(".", "_"))
                if each and r.get("result") == "ok":
                    bw = (before + dram_now(a.threads)) / 2
                    r.update(dram_bw=bw, dram_ratio=r["decode"] * (facts["routed_per_tok"] + facts["dense_per_tok"]) / bw)
                if each_disk and r.get("result") == "ok" and r.get("hit") is not None:
                    bw = (disk_before + disk_now(path, facts)) / 2
                    miss = facts["routed_per_tok"] * (1 - r["hit"] / 100)
                    r.update(disk_run_bw=bw, disk_ratio=r["decode"] * miss / bw)
                r.update(file=label, path=str(path), run=i)
                log_run(tag, r, rec)
                if r.get("result") != "ok" and r.get("stderr_tail"):
                    print("#     stderr: " + r["stderr_tail"].replace("\n", " | "), file=sys.stderr)
                rows.append(r)
                if r.get("result", "").startswith("OOM") or r.get("result", "").startswith("timeout"):
                    stopped.add(eng)  # the same cap kills every run: one is enough
            for eng in engines if order else []:
                rows = rows_of[eng]
                s = summarize(rows)
                s.update(file=label, engine="llama.cpp" if eng == "llama" else eng, cap=cap, facts=facts, n=len(rows))
                if a.interleave and eng == "ours" and "llama" in rows_of:
                    s["pairs"] = [(o["decode"], ll["decode"]) for o, ll in zip(rows, rows_of["llama"])
                                  if o.get("result") == "ok" and ll.get("result") == "ok"]
                if s.get("hit") is not None and cap:
                    hits.append(s["hit"])
                    row_bound(a, path, facts, s, bw_now)
                table.append(s)
                if a.warm and eng == "ours" and (cap or a.auto_budget):
                    s = warm_rows(a, path, facts, cap, prompt, f"{label}-warm-{cap or 'none'}".replace(".", "_"), rec)
                    s.update(file=label, engine="ours, warm start", cap=cap, facts=facts)
                    if s.get("hit") is not None and cap:
                        hits.append(s["hit"])
                        row_bound(a, path, facts, s, bw_now)
                    table.append(s)
            if a.spec and "ours" in engines:
                spec_table_rows.append(spec_rows(a, path, facts, cap, prompt,
                                                 f"{label}-spec-{cap or 'none'}".replace(".", "_"), rec))
                spec_table_rows[-1]["file"] = label
            if a.long_prompts and "ours" in engines:
                for s in long_rows(a, path, facts, cap, f"{label}-{cap or 'none'}".replace(".", "_"), rec, full_prefill):
                    s.update(file=label)
                    long_table_rows.append(s)
        if a.slots8 and "ours" in engines:
            prompts = [prompt_text(a.prompt_tokens, 20000 * (k + 1)) for k in range(8)]
            rows = []
            for i in range(a.runs):
                r = run_ours_slots(a, path, prompts, f"{label}-slots8-{i}")
                print(f"#   {label}-slots8-{i}: {json.dumps(r)}", file=sys.stderr, flush=True)
                rows.append(r)
            ok = [r["aggregate"] for r in rows if r.get("result") == "ok"]
            table.append(dict(file=label, engine="ours, 8 conversations", cap=None, facts=facts, n=len(rows),
                              result="ok" if ok else rows[0]["result"], decode=statistics.median(ok) if ok else None,
                              dmin=min(ok) if ok else None, dmax=max(ok) if ok else None,
                              peak=max(r["peak"] for r in rows)))

    print()
    print("| file | engine | cap | EXPERT_RAM_MB | result | decode tok/s (median; min–max) | prefill tok/s | TTFT s | "
          "load s | peak GiB (cgroup) | disk MB/tok | ideal MB/tok | hit % | top-¼ share | disk bound tok/s (× reached) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in table:
        f = s["facts"]
        dec = "–" if s.get("decode") is None else f"{s['decode']:.2f} ({s['dmin']:.2f}–{s['dmax']:.2f}; n={s['n']})"
        ram = s.get("ram")
        cap_s = "none" if not s["cap"] else f"{s['cap']:g} GB"
        print(f"| {s['file']} ({f['layers']} L, {f['size'] / 2**30:.1f} GiB) | {s['engine']} | "
              f"{cap_s} | "
              f"{ram if ram is not None else ('all' if s['engine'].startswith('ours') else '–')} | {s['result']} | {dec} | "
              f"{fmt(s.get('prefill'))} | {fmt(s.get('ttft'))} | {fmt(s.get('load'), '.1f')} | {s['peak'] / 2**30:.2f} | "
              f"{fmt(None if s.get('disk') is None else s['disk'] / 1e6, '.1f')} | "
              f"{f['routed_per_tok'] / 1e6:.1f} | {fmt(s.get('hit'), '.1f')} | {fmt(s.get('tq'), '.3f')} | "
              f"{bound_cell(s)} |")
    long_table(long_table_rows, facts_of)
    spec_table(spec_table_rows)
    per_run_table(table, "dram_runs", "dram_ratio", "decode ÷ that run's bound (median; min–max)",
                  [("file", lambda s: s["file"]), ("engine", lambda s: s["engine"])],
                  [("decode tok/s per run", lambda r: f"{r['decode']:.2f}"),
                   ("DRAM GB/s at each run", lambda r: f"{r['dram_bw'] / 1e9:.1f}")])
    per_run_table(table, "disk_runs", "disk_ratio", "decode ÷ that run's disk bound (median; min–max)",
                  [("file", lambda s: s["file"]), ("engine", lambda s: s["engine"]),
                   ("cap", lambda s: f"{s['cap']:g} GB")],
                  [("decode tok/s per run", lambda r: f"{r['decode']:.2f}"),
                   ("hit % per run", lambda r: f"{r['hit']:.1f}"),
                   ("disk GB/s at each run (mean of the readings before and after)",
                    lambda r: f"{r['disk_run_bw'] / 1e9:.2f}")])
    paired = [s for s in table if s.get("pairs")]
    if paired:
        print()
        print("| file | cap | pairs (ours, llama.cpp tok/s, run by run) | ours ÷ llama.cpp per pair (median; min–max) |")
        print("|---|---|---|---|")
        for s in paired:
            ratios = [o / ll for o, ll in s["pairs"]]
            cap_s = "none" if not s["cap"] else f"{s['cap']:g} GB"
            pairs = ", ".join(f"{o:.2f} / {ll:.2f}" for o, ll in s["pairs"])
            print(f"| {s['file']} | {cap_s} | {pairs} | **{statistics.median(ratios):.2f}×** "
                  f"({min(ratios):.2f}–{max(ratios):.2f}) |")
    if a.disk:
        f = facts_of[files[0][1]]
        path = files[0][1]
        cold_cache(path)
        bw = {n: disk_bw(str(path), f["slices"], f["n_exp"], n) for n in (1, 2, 4)}
        dram = dram_bw(a.threads)
        print()
        print("| measure | value | bound it implies |")
        print("|---|---|---|")
        for n in (1, 2, 4):
            line = f"{bw[n] / 1e9:.2f} GB/s uniform, nothing cached: {bw[n] / f['routed_per_tok']:.2f} tok/s"
            for h in sorted(set(round(x, 1) for x in hits)):
                if h < 100:
                    line += f"; at hit {h:.1f} %: {bw[n] / (f['routed_per_tok'] * (1 - h / 100)):.2f} tok/s"
            print(f"| O_DIRECT reads of random expert slices, {n} lane{'s' if n > 1 else ''} | {bw[n] / 1e9:.2f} GB/s | "
                  f"decode ≤ {line.split(': ', 1)[1]} ({f['routed_per_tok'] / 1e6:.0f} MB of routed experts per token) |")
        tok_bytes = f["routed_per_tok"] + f["dense_per_tok"]
        print(f"| DRAM read (numpy float32 sum, {a.threads} threads, 2 GiB) | {dram / 1e9:.1f} GB/s | decode ≤ "
              f"{dram / tok_bytes:.1f} tok/s ({tok_bytes / 1e6:.0f} MB read per token: non-expert matrices + top-{f['top_k']} experts) |")
    if rec:
        rec.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
