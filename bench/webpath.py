#!/usr/bin/env python3
"""What the web path costs on top of the engine (issue 14). A benchmark, not a test.

    .venv/bin/python bench/webpath.py [--model tiny|default|PATH] [--clients 1,4,8] [--rounds 5]
                                      [--max-tokens 128] [--buffered] [--client httpx,socket,openai]
                                      [--variant 'NAME=VALUE ...'] [--base CHECKOUT]

Two ways to the same engine binary and model, same prompts, greedy, in one sitting, interleaved
round by round (raw, web, raw, web, ...):
* raw: a driver speaking the mux protocol on an engine's own pipes (SUBMITs to distinct slots in
  one write; first token = first DATA after the write);
* web: the streaming `POST /v1/chat/completions` through Daphne + channel layer (Redis) + bridge
  + engine, N clients at once with httpx; first token = first content delta received. The web
  clients share one pooled client on one event loop for the whole sitting, as an SDK keeps its
  connections alive (the raw driver keeps its pipes): httpx (the official SDKs' library; default)
  or `--client socket`, a minimal HTTP/1.1 client that costs about as little CPU as the raw driver,
  so that its rows show what the server's path adds rather than what the client library costs on
  the same two cores (httpx: ~1.6 ms of CPU per request, ~5 ms of the first token at 8 clients),
  or `--client openai`, the official SDK (each chunk parsed into its types), as a harness built on
  the SDK measures. Several, comma separated, are sides of their own on the same stack, their
  rounds interleaved (each with prompts of its own).
After one uncounted warm-up round on each side, per round it prints first-token time added by the
web path (median over the round's clients, web minus raw; the mean too) and aggregate completion tok/s web / raw;
then medians over rounds. Each round uses fresh prompts, so neither side reuses a KV prefix.
`--buffered` measures stream=false too (no first token: its rows compare the whole answer's latency
with the raw engine's DONE). At the end: CPU seconds per 1,000 tokens of each of our processes
(Daphne, bridge, its engine, the Celery worker, Redis; the raw engine for reference) from /proc.

A/Bs in one sitting: `--variant` adds a second stack with settings of its own, `--base` one run
from another checkout (`git worktree add /tmp/base HEAD~1`: a code change against its parent);
the sides take turns right after the raw round, and the summary also gives each side's medians
by its place in the round, since a side right after another web side measures worse.
The stack is private: its own Redis database, a free port, the database of DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/colibri_bench, migrated here).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
NONEMPTY_CONTENT = re.compile(rb'"content":"[^"]')  # a delta with text (the server's compact JSON)


def cpu_seconds(pid):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def wakeups(pid):
    """Voluntary context switches of all the process's threads: each is a sleep that something
    ended (a wakeup), and on two cores shared with the engine a wakeup preempts an engine thread."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            for line in open(f"/proc/{pid}/task/{tid}/status"):
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    except OSError:
        pass
    return total


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

    def __init__(self, model, slots, ctx, extra_env=None, root=ROOT):
        self.root = root  # the checkout its processes run from (--base: another one)
        self.redis_url = procs.claim_redis_db()
        self.port = procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/colibri_bench")
        self.env = {**os.environ, "DATABASE_URL": db, "REDIS_URL": self.redis_url, "CELERY_BROKER_URL": self.redis_url,
                    "CACHE_PREFIX": f"bench-{uuid.uuid4().hex[:8]}", "COLIBRI_DEV": "1",
                    "ENGINE_MODEL": str(model), "KV_SLOTS": str(slots), "CTX": str(ctx),
                    "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "DJANGO_SETTINGS_MODULE": "colibri_site.settings",
                    **(extra_env or {})}
        os.environ.update({k: self.env[k] for k in ("DATABASE_URL", "REDIS_URL", "CACHE_PREFIX", "COLIBRI_DEV",
                                                    "DJANGO_SETTINGS_MODULE")})
        self._ensure_database(db)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=root, env=self.env, check=True)
        import django
        django.setup()
        from api.models import ApiKey
        from django.contrib.auth import get_user_model
        user, _ = get_user_model().objects.get_or_create(username="bench")
        self.key = ApiKey.issue(user=user, name="bench")[1]
        self.logs = open(f"/tmp/webpath-bench-{self.port}.log", "wb")
        self.bridge = procs.start_bridge(self.env, timeout=120, root=root)
        self.daphne = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port),
                                        "colibri_site.asgi:application"], cwd=root, env=self.env,
                                       stdout=self.logs, stderr=subprocess.STDOUT)
        procs.wait_for_port(self.port, self.daphne)
        # The Celery worker, as `make run` starts it: nothing of a /v1 stream passes through it,
        # and its row shows that (its CPU here is its own idle polling of the broker).
        self.worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "colibri_site", "worker", "-l", "warning",
                                        "-c", "1", "--without-gossip", "--without-mingle"], cwd=root, env=self.env,
                                       stdout=self.logs, stderr=subprocess.STDOUT)
        import redis
        self.redis_pid = redis.Redis.from_url(self.redis_url).info("server")["process_id"]
        self._wait_quiet(self.worker.pid)

    @staticmethod
    def _wait_quiet(pid, limit=60):
        """Until the process's start-up is over (it used under 2 % of a core for half a second):
        the worker's own start-up (a few CPU seconds of imports) would otherwise run beside the
        first rounds and count as the web path's cost."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            before = cpu_seconds(pid)
            time.sleep(0.5)
            if cpu_seconds(pid) - before < 0.01:
                return

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
                "worker (celery)": self.worker.pid, "redis": self.redis_pid}

    def close(self):
        procs.stop(self.worker)
        procs.stop(self.daphne)
        procs.stop(self.bridge)
        procs.release_redis_db(self.redis_url)


async def web_round(client, stack, model_id, prompts, max_tokens, stream):
    async def one(prompt):
        body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "top_p": 1, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        first, tokens = await client.chat(body)
        return t0, first or time.perf_counter(), time.perf_counter(), tokens

    results = await asyncio.gather(*(one(p) for p in prompts))
    start = min(r[0] for r in results)
    end = max(r[2] for r in results)
    ttft = statistics.median(r[1] - r[0] for r in results)
    mean = statistics.fmean(r[1] - r[0] for r in results)
    return ttft, sum(r[3] for r in results) / (end - start), sum(r[3] for r in results), mean


class HttpxClient:
    """The official SDKs' HTTP library (httpx), one pooled client with keep-alive connections."""

    def __init__(self, stack):
        self.stack = stack
        self.headers = {"Authorization": f"Bearer {stack.key}"}
        self.http = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))

    async def open(self, connections):
        await asyncio.gather(*(self.http.get(f"{self.stack.url}/v1/models", headers=self.headers)
                               for _ in range(connections)))

    async def chat(self, body):
        """(time of the first content delta or None, completion tokens)"""
        url = f"{self.stack.url}/v1/chat/completions"
        if not body["stream"]:
            r = await self.http.post(url, json=body, headers=self.headers)
            r.raise_for_status()
            return None, r.json()["usage"]["completion_tokens"]
        first, tokens = None, 0
        async with self.http.stream("POST", url, json=body, headers=self.headers) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        return first, tokens

    async def close(self):
        await self.http.aclose()


class OpenAIClient:
    """The official `openai` SDK as an API client writes it: one AsyncOpenAI (its own pooled httpx
    client), `chat.completions.create(stream=True)`, every chunk parsed into the SDK's
    ChatCompletionChunk. Its per-chunk parsing runs on the same two cores as the engine, which is
    what a harness built on the SDK measures beside the server's path."""

    def __init__(self, stack):
        import openai
        self.sdk = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0, timeout=600)

    async def open(self, connections):
        await asyncio.gather(*(self.sdk.models.list() for _ in range(connections)))

    async def chat(self, body):
        body = dict(body)
        if not body.pop("stream"):
            r = await self.sdk.chat.completions.create(**body)
            return None, r.usage.completion_tokens
        first, tokens = None, 0
        async for chunk in await self.sdk.chat.completions.create(stream=True, **body):
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return first, tokens

    async def close(self):
        await self.sdk.close()


def http_request(stack, path, body=None):
    """One HTTP/1.1 request with the stack's API key: a GET, or a POST of `body` as JSON."""
    auth = b"Authorization: Bearer " + stack.key.encode() + b"\r\n"
    if body is None:
        return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"\r\n"
    data = json.dumps(body).encode()
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + auth
            + b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)


async def http_body(reader, head):
    """The pieces of an HTTP/1.1 response body after its (lower-cased) head: chunked or sized."""
    if b"transfer-encoding: chunked" not in head:
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        yield await reader.readexactly(length)
        return
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
        piece = await reader.readexactly(size + 2)
        if size == 0:
            return
        yield piece[:-2]


class SocketClient:
    """A minimal HTTP/1.1 client on asyncio streams (keep-alive, chunked SSE), as lean as the raw
    driver: it decodes JSON only for the first content delta and the usage, so what the web rows
    measure is the server's path, not the client library's CPU on the same two cores."""

    def __init__(self, stack):
        self.stack, self.idle = stack, []

    async def open(self, connections):
        for _ in range(connections):
            self.idle.append(await asyncio.open_connection("127.0.0.1", self.stack.port))

    async def chat(self, body):
        reader, writer = self.idle.pop() if self.idle else await asyncio.open_connection("127.0.0.1", self.stack.port)
        writer.write(http_request(self.stack, "/v1/chat/completions", body))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        first, tokens, body_bytes = None, 0, b""
        async for piece in http_body(reader, head.lower()):
            if not body["stream"]:
                body_bytes += piece
                continue
            if first is None and NONEMPTY_CONTENT.search(piece):
                first = time.perf_counter()
            if b'"usage":{' in piece:
                line = next(x for x in piece.split(b"\n") if b'"usage":{' in x)
                tokens = json.loads(line[6:])["usage"]["completion_tokens"]
        if not body["stream"]:
            tokens = json.loads(body_bytes)["usage"]["completion_tokens"]
        self.idle.append((reader, writer))
        return first, tokens

    async def close(self):
        for _, writer in self.idle:
            writer.close()


def raw_round(mux, prompts, max_tokens, stream=True):
    """(median first-token time, or with stream=False median whole-answer time; tok/s; tokens;
    mean of the same latency)"""
    t0, ids = mux.run(prompts, list(range(len(prompts))), max_tokens)
    latencies = [(mux.data[i][0] if stream else mux.done[i][0]) - t0 for i in ids]
    end = max(mux.done[i][0] for i in ids)
    tokens = sum(len(mux.data.get(i, [])) for i in ids)
    return statistics.median(latencies), tokens / (end - t0), tokens, statistics.fmean(latencies)


class Side:
    """One web stack of the sitting with its client and its counters."""

    def __init__(self, label, stack, client):
        self.label, self.stack, self.client = label, stack, client
        self.pids = stack.pids()
        self.cpu = {name: 0.0 for name in self.pids}
        self.wakes = {name: 0 for name in self.pids}
        self.tokens = 0
        self.rows = {}
        self.by_position = {}  # (stream, clients, place after the raw round) -> [(added ms, web / raw)]

    def measure(self, runner, model_id, texts, max_tokens, stream):
        before = {name: (cpu_seconds(pid), wakeups(pid)) for name, pid in self.pids.items()}
        result = runner.run(web_round(self.client, self.stack, model_id, texts, max_tokens, stream))
        for name, pid in self.pids.items():
            self.cpu[name] += cpu_seconds(pid) - before[name][0]
            self.wakes[name] += wakeups(pid) - before[name][1]
        self.tokens += result[2]
        return result


def parse_variant(text):
    """'NAME=VALUE NAME=VALUE' -> the environment of the variant web stack (a value may hold commas
    and '=': ENGINE_ENV=KVSAVE=0,USAGE_SAVE=0,POOL_SPIN=4000)."""
    env = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant: expected NAME=VALUE, got {item!r}")
        env[name] = value
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--buffered", action="store_true")
    ap.add_argument("--client", default="httpx",
                    help="the web clients, comma separated, each a side of its own interleaved with the others "
                         "on the same stack: httpx (the SDKs' HTTP library), socket (a minimal HTTP/1.1 client), "
                         "openai (the official SDK, every chunk parsed into its types)")
    ap.add_argument("--variant", metavar="'NAME=VALUE ...'",
                    help="a second web stack with these settings in its environment, its rounds interleaved "
                         "with the first's: an A/B of a setting in one sitting, whatever the host's mood")
    ap.add_argument("--base", metavar="CHECKOUT",
                    help="a second web stack (Daphne, bridge, worker) run from another checkout, e.g. "
                         "`git worktree add /tmp/base HEAD~1`, its rounds interleaved with this one's: an A/B "
                         "of a code change in one sitting (same venv, engine binary and model)")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    if args.model == "tiny":
        model = procs.make_tiny_model(Path("/tmp/webpath-tiny.gguf"))
    elif args.model == "default":
        model = ROOT / "models/smollm2-135m-moe16.gguf"
    else:
        model = Path(args.model)
    slots, ctx = max(clients), 2048
    variant = parse_variant(args.variant) if args.variant else None
    stacks = [("web", Stack(model, slots, ctx))]
    try:
        if variant is not None:
            stacks.append((f"web [{args.variant}]", Stack(model, slots, ctx, extra_env=variant)))
        if args.base:
            base = Path(args.base).resolve()
            if not (base / "manage.py").is_file():
                raise SystemExit(f"--base: {base} is not a checkout of this project (no manage.py)")
            binary = os.environ.get("ENGINE_BINARY", str(ROOT / "native/build/colibri-engine"))
            stacks.append((f"web [base {base}]", Stack(model, slots, ctx, extra_env={"ENGINE_BINARY": binary},
                                                       root=base)))
        run_sitting(args, model, clients, slots, ctx, stacks)
    finally:
        for _, stack in stacks:
            stack.close()


def run_sitting(args, model, clients, slots, ctx, stacks):
    from engine_bridge.prompting import render_prompt, template_source

    template, bos, eos = template_source()
    mux_env = {**os.environ, "SERVE": "1", "SERVE_BATCH": "1", "SNAP": str(model), "KV_SLOTS": str(slots),
               "CTX": str(ctx), "KVSAVE": "0", "USAGE_SAVE": "0"}
    mux = Mux(mux_env)
    model_id = stacks[0][1].model_id()
    modes = [True, False] if args.buffered else [True]
    raw_cpu = raw_wakes = raw_tokens = 0
    n = 0
    # One event loop and one pooled client per stack for every web round, as an SDK keeps its
    # connections (the raw driver keeps its pipes): a round pays no TCP handshakes.
    runner = asyncio.Runner()
    kinds = {"httpx": HttpxClient, "socket": SocketClient, "openai": OpenAIClient}
    names = args.client.split(",")
    if not names or any(n not in kinds for n in names):
        raise SystemExit(f"--client: each of {', '.join(kinds)}, got {args.client!r}")
    sides = [Side(label if len(names) == 1 else f"{label} ({name})", stack, kinds[name](stack))
             for label, stack in stacks for name in names]
    for side in sides:
        runner.run(side.client.open(max(clients)))
    # A warm-up round on each side, not counted: first-use costs (page cache, lazy imports,
    # the first prefix of each slot) belong to neither path's steady state.
    warm = [f"Warm up #{i}." for i in range(max(clients))]
    raw_round(mux, [render_prompt([{"role": "user", "content": t}], template=template, bos_token=bos, eos_token=eos) for t in warm], args.max_tokens)
    for side in sides:
        runner.run(web_round(side.client, side.stack, model_id, warm, args.max_tokens, True))
    for rnd in range(args.rounds):
        for stream in modes:
            for c in clients:
                n += 1
                texts = [f"Write a short poem about {TOPICS[(n * 7 + i) % len(TOPICS)]} (#{n}-{i})." for i in range(c)]
                prompts = [render_prompt([{"role": "user", "content": t}], template=template, bos_token=bos, eos_token=eos) for t in texts]
                before, woke = cpu_seconds(mux.p.pid), wakeups(mux.p.pid)
                r_ttft, r_rate, r_tok, r_mean = raw_round(mux, prompts, args.max_tokens, stream)
                raw_cpu += cpu_seconds(mux.p.pid) - before
                raw_wakes += wakeups(mux.p.pid) - woke
                raw_tokens += r_tok
                label = "stream" if stream else "buffered"
                what = "first token" if stream else "whole answer"
                line = f"round {rnd + 1} {label:8} clients={c}: raw {what} {r_ttft * 1000:7.1f} ms {r_rate:8.1f} tok/s"
                # The sides take turns following the raw round (rotated each round), each with the
                # round's texts under a tag of its own, so that no side reuses another's KV prefix.
                order = sides[rnd % len(sides):] + sides[:rnd % len(sides)]
                for k, side in enumerate(order):
                    mine = texts if k == 0 else [f"{t} [{k}]" for t in texts]
                    w_ttft, w_rate, _, w_mean = side.measure(runner, model_id, mine, args.max_tokens, stream)
                    added, ratio = (w_ttft - r_ttft) * 1000, w_rate / r_rate
                    side.rows.setdefault((stream, c), []).append((added, ratio, r_ttft * 1000, r_rate, w_rate,
                                                                  (w_mean - r_mean) * 1000))
                    side.by_position.setdefault((stream, c, k), []).append((added, ratio))
                    line += (f" | {side.label} {w_ttft * 1000:7.1f} ms {w_rate:8.1f} tok/s, added {added:+7.1f} ms,"
                             f" ratio {ratio:.3f}")
                print(line, flush=True)
    for side in sides:
        print(f"\n{side.label}: model {model.name}, {args.rounds} rounds, max_tokens {args.max_tokens}, "
              f"web client {args.client}, medians over rounds:\n")
        print("| mode | clients | raw first token (buffered: whole answer) ms | added by web ms (median of the "
              "round's clients) | added, mean of clients | raw tok/s | web tok/s | web / raw |")
        print("|---|---|---|---|---|---|---|---|")
        for (stream, c), vals in side.rows.items():
            med = [statistics.median(v[k] for v in vals) for k in range(6)]
            print(f"| {'stream' if stream else 'buffered'} | {c} | {med[2]:.1f} | {med[0]:+.1f} | {med[5]:+.1f} | "
                  f"{med[3]:.0f} | {med[4]:.0f} | {med[1]:.3f} |")
    if len(sides) > 1:
        # A side measures worse right after another web side than right after the raw round
        # (2026-12-05: +30.6 against +21.4 ms at 8 clients, 20 rounds each): the rotation
        # balances that, and these rows show it, so that an A/B compares like with like.
        print("\nby place in the round (1 = right after the raw round), medians: added ms, web / raw")
        for side in sides:
            for (stream, c, k), vals in sorted(side.by_position.items()):
                print(f"  {side.label} | {'stream' if stream else 'buffered'} | {c} clients | place {k + 1}: "
                      f"{statistics.median(v[0] for v in vals):+.1f} ms, "
                      f"{statistics.median(v[1] for v in vals):.3f} ({len(vals)} rounds)")
    for side in sides:
        print(f"\n{side.label}: per 1,000 completion tokens (its web rounds; the raw engine over raw rounds): "
              "CPU seconds, and wakeups (voluntary context switches, all threads)\n")
        counts = [(name, side.cpu[name], side.wakes[name], side.tokens) for name in side.pids]
        counts.append(("engine (raw)", raw_cpu, raw_wakes, raw_tokens))
        for name, seconds, wakes, tokens in counts:
            tokens = max(tokens, 1)
            print(f"  {name:18} {seconds / tokens * 1000:7.3f} s {wakes / tokens * 1000:8.0f} wakeups")
    for side in sides:
        runner.run(side.client.close())
    runner.close()
    mux.close()


if __name__ == "__main__":
    main()
