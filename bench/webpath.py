#!/usr/bin/env python3
"""What the web path costs on top of the engine (issue 14). A benchmark, not a test.

    .venv/bin/python bench/webpath.py [--model tiny|default|PATH] [--clients 1,4,8] [--rounds 5]
                                      [--max-tokens 128] [--buffered]

Two ways to the same engine binary and model, same prompts, greedy, in one sitting, interleaved
round by round (raw, web, raw, web, ...):
* raw: a driver speaking the mux protocol on an engine's own pipes (SUBMITs to distinct slots in
  one write; first token = first DATA after the write);
* web: the streaming `POST /v1/chat/completions` through Daphne + channel layer (Redis) + bridge
  + engine, N clients at once with httpx; first token = first content delta received.
Per round it prints first-token time added by the web path (median over the round's clients,
web minus raw) and aggregate completion tok/s web / raw; then medians over rounds. Each round
uses fresh prompts, so neither side reuses a KV prefix. `--buffered` measures stream=false too
(no first token: the whole answer's latency). At the end: CPU seconds per 1,000 tokens of each
of our processes (Daphne, bridge, its engine, Redis; the raw engine for reference) from /proc.

The stack is private: its own Redis database, a free port, the database of DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/colibri_bench, migrated here).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from engine import Mux  # noqa: E402  (bench/engine.py's mux driver)

from tests.support import procs  # noqa: E402

TOPICS = ["the sea", "a violin", "winter", "a red fox", "bread", "the moon", "a lighthouse", "rain",
          "mountains", "a clock", "tea", "the desert", "a library", "bees", "a river", "snow"]
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def child_engine(pid):
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmd = open(f"/proc/{entry}/cmdline", "rb").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"colibri-engine" in cmd:
                return int(entry)
    return None


class Stack:
    """Daphne + run_bridge on a private Redis database; an API key for the web clients."""

    def __init__(self, model, slots, ctx):
        self.redis_url = procs.claim_redis_db()
        self.port = procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/colibri_bench")
        self.env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": self.redis_url, "CELERY_BROKER_URL": self.redis_url,
                    "CACHE_PREFIX": f"bench-{uuid.uuid4().hex[:8]}", "COLIBRI_DEV": "1",
                    "ENGINE_MODEL": str(model), "KV_SLOTS": str(slots), "CTX": str(ctx),
                    "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "DJANGO_SETTINGS_MODULE": "colibri_site.settings"}
        os.environ.update({k: self.env[k] for k in ("DATABASE_URL", "REDIS_URL", "CACHE_PREFIX", "COLIBRI_DEV",
                                                    "DJANGO_SETTINGS_MODULE")})
        self._ensure_database(db)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=self.env, check=True)
        import django
        django.setup()
        from api.models import ApiKey
        from django.contrib.auth import get_user_model
        user, _ = get_user_model().objects.get_or_create(username="bench")
        self.key = ApiKey.issue(user=user, name="bench")[1]
        self.logs = open("/tmp/webpath-bench.log", "wb")
        self.bridge = procs.start_bridge(self.env, timeout=120)
        self.daphne = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                        "colibri_site.asgi:application"], cwd=ROOT, env=self.env,
                                       stdout=self.logs, stderr=subprocess.STDOUT)
        procs.wait_for_port(self.port, self.daphne)
        import redis
        self.redis_pid = redis.Redis.from_url(self.redis_url).info("server")["process_id"]

    @staticmethod
    def _ensure_database(url):
        import psycopg
        base, name = url.rsplit("/", 1)
        with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')

    def model_id(self):
        r = httpx.get(f"{self.url}/v1/models", headers={"Authorization": f"Bearer {self.key}"})
        return r.json()["data"][0]["id"]

    def pids(self):
        return {"daphne": self.daphne.pid, "bridge": self.bridge.pid, "engine (bridge's)": child_engine(self.bridge.pid),
                "redis": self.redis_pid}

    def close(self):
        procs.stop(self.daphne)
        procs.stop(self.bridge)
        procs.release_redis_db(self.redis_url)


async def web_round(stack, model_id, prompts, max_tokens, stream):
    headers = {"Authorization": f"Bearer {stack.key}"}

    async def one(client, prompt):
        body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "top_p": 1, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        first, tokens = None, 0
        if not stream:
            r = await client.post(f"{stack.url}/v1/chat/completions", json=body, headers=headers)
            r.raise_for_status()
            return t0, time.perf_counter(), time.perf_counter(), r.json()["usage"]["completion_tokens"]
        async with client.stream("POST", f"{stack.url}/v1/chat/completions", json=body, headers=headers) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return t0, first, time.perf_counter(), tokens

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        results = await asyncio.gather(*(one(client, p) for p in prompts))
    start = min(r[0] for r in results)
    end = max(r[2] for r in results)
    ttft = statistics.median(r[1] - r[0] for r in results)
    return ttft, sum(r[3] for r in results) / (end - start), sum(r[3] for r in results)


def raw_round(mux, prompts, max_tokens):
    t0, ids = mux.run(prompts, list(range(len(prompts))), max_tokens)
    ttft = statistics.median(mux.data[i][0] - t0 for i in ids)
    end = max(mux.done[i][0] for i in ids)
    tokens = sum(len(mux.data.get(i, [])) for i in ids)
    return ttft, tokens / (end - t0), tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--buffered", action="store_true")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.model == "tiny":
        model = procs.make_tiny_model(Path("/tmp/webpath-tiny.gguf"))
    elif args.model == "default":
        model = ROOT / "models/smollm2-135m-moe16.gguf"
    else:
        model = Path(args.model)
    slots, ctx = max(clients), 2048
    stack = Stack(model, slots, ctx)
    try:
        from engine_bridge.prompting import render_prompt
        mux_env = {**os.environ, "SERVE": "1", "SERVE_BATCH": "1", "SNAP": str(model), "KV_SLOTS": str(slots),
                   "CTX": str(ctx), "KVSAVE": "0", "USAGE_SAVE": "0"}
        mux = Mux(mux_env)
        model_id = stack.model_id()
        modes = [True, False] if args.buffered else [True]
        rows = {}
        pids = stack.pids()
        cpu = {name: 0.0 for name in pids} | {"engine (raw)": 0.0}
        web_tokens = raw_tokens = 0
        n = 0
        for rnd in range(args.rounds):
            for stream in modes:
                for c in clients:
                    n += 1
                    texts = [f"Write a short poem about {TOPICS[(n * 7 + i) % len(TOPICS)]} (#{n}-{i})." for i in range(c)]
                    prompts = [render_prompt([{"role": "user", "content": t}]) for t in texts]
                    before = cpu_seconds(mux.p.pid)
                    r_ttft, r_rate, r_tok = raw_round(mux, prompts, args.max_tokens)
                    cpu["engine (raw)"] += cpu_seconds(mux.p.pid) - before
                    raw_tokens += r_tok
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    w_ttft, w_rate, w_tok = asyncio.run(web_round(stack, model_id, texts, args.max_tokens, stream))
                    for name, pid in pids.items():
                        cpu[name] += cpu_seconds(pid) - before[name]
                    web_tokens += w_tok
                    added = (w_ttft - r_ttft) * 1000
                    ratio = w_rate / r_rate
                    rows.setdefault((stream, c), []).append((added, ratio, r_ttft * 1000, r_rate, w_rate))
                    label = "stream" if stream else "buffered"
                    print(f"round {rnd + 1} {label:8} clients={c}: raw first token {r_ttft * 1000:7.1f} ms "
                          f"{r_rate:8.1f} tok/s | web {'first token' if stream else 'whole answer'} "
                          f"{w_ttft * 1000:7.1f} ms {w_rate:8.1f} tok/s | added {added:+7.1f} ms, ratio {ratio:.3f}",
                          flush=True)
        print(f"\nmodel {model.name}, {args.rounds} rounds, max_tokens {args.max_tokens}, medians over rounds:\n")
        print("| mode | clients | raw first token ms | first token added by web ms | raw tok/s | web tok/s | web / raw |")
        print("|---|---|---|---|---|---|---|")
        for (stream, c), vals in rows.items():
            med = [statistics.median(v[k] for v in vals) for k in range(5)]
            print(f"| {'stream' if stream else 'buffered'} | {c} | {med[2]:.1f} | {med[0]:+.1f} | {med[3]:.0f} | "
                  f"{med[4]:.0f} | {med[1]:.3f} |")
        print("\nCPU seconds per 1,000 completion tokens (web rounds; raw engine over raw rounds):\n")
        for name, seconds in cpu.items():
            tokens = raw_tokens if name == "engine (raw)" else web_tokens
            print(f"  {name:18} {seconds / max(tokens, 1) * 1000:7.3f}")
        mux.close()
    finally:
        stack.close()


if __name__ == "__main__":
    main()
