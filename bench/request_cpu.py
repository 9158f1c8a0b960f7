#!/usr/bin/env python3
"""What one API request costs our processes, in CPU, apart from its tokens (issue 14). A benchmark.

    .venv/bin/python bench/request_cpu.py [--model tiny|default|PATH] [--requests 300] [--concurrency 1,8]

Why: on a small host the web path's cost per request, not per token, decides how much of a fast
engine's throughput short requests keep (bench/webpath.py's tiny-fixture rows): every millisecond
of Daphne or bridge CPU per request runs on the cores the engine uses. This prints, per route, the
CPU milliseconds per request of Daphne, the bridge, its engine and Redis (from /proc), for
keep-alive requests sent one at a time and N at once from a lean socket client:
* GET /v1/models: API-key authentication + DRF + the lean middleware chain, no engine: the floor
  of any /v1 request;
* POST /v1/chat/completions with max_tokens=1, buffered and streaming: a whole generation's
  plumbing (admission, submit, the bridge's events, the response) around one token.
The stack is bench/webpath.py's (private Redis database, free port, DATABASE_URL's database).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from webpath import Stack, cpu_seconds, http_body, http_request  # noqa: E402

from tests.support import procs  # noqa: E402


class Connection:
    """One keep-alive HTTP/1.1 connection that sends a fixed request and reads its whole answer."""

    def __init__(self, stack, request):
        self.stack, self.request = stack, request

    async def open(self):
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.stack.port)

    async def once(self):
        self.writer.write(self.request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        async for _ in http_body(self.reader, head.lower()):
            pass

    def close(self):
        self.writer.close()


async def measure(stack, request, requests, concurrency):
    """CPU ms per request of each process, `requests` requests over `concurrency` connections."""
    connections = [Connection(stack, request) for _ in range(concurrency)]
    for connection in connections:
        await connection.open()
    await asyncio.gather(*(c.once() for c in connections))  # warm: first-use costs are not per request
    pids = stack.pids()
    before = {name: cpu_seconds(pid) for name, pid in pids.items() if pid}
    rounds = max(1, requests // concurrency)
    for _ in range(rounds):
        await asyncio.gather(*(c.once() for c in connections))
    spent = {name: (cpu_seconds(pids[name]) - seconds) * 1000 / (rounds * concurrency)
             for name, seconds in before.items()}
    for connection in connections:
        connection.close()
    return spent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", default="1,8")
    args = ap.parse_args()
    model = (procs.make_tiny_model(Path("/tmp/webpath-tiny.gguf")) if args.model == "tiny"
             else ROOT / "models/smollm2-135m-moe16.gguf" if args.model == "default" else Path(args.model))
    levels = [int(c) for c in args.concurrency.split(",")]
    stack = Stack(model, max(levels), 2048)
    try:
        model_id = stack.model_id()
        chat = {"model": model_id, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 1,
                "temperature": 0}
        routes = [("GET /v1/models", http_request(stack, "/v1/models")),
                  ("chat, max_tokens=1, buffered", http_request(stack, "/v1/chat/completions", chat)),
                  ("chat, max_tokens=1, stream", http_request(stack, "/v1/chat/completions", {**chat, "stream": True}))]
        names = ["daphne", "bridge", "engine (bridge's)", "redis"]
        print(f"model {model.name}, {args.requests} requests per row, CPU ms per request (from /proc):\n")
        print("| route | at once | " + " | ".join(names) + " | web path (daphne + bridge + redis) |")
        print("|---|---|" + "---|" * (len(names) + 1))
        for label, request in routes:
            for level in levels:
                spent = asyncio.run(measure(stack, request, args.requests, level))
                web = spent["daphne"] + spent["bridge"] + spent["redis"]
                print(f"| {label} | {level} | " + " | ".join(f"{spent[n]:.2f}" for n in names) + f" | {web:.2f} |",
                      flush=True)
    finally:
        stack.close()


if __name__ == "__main__":
    main()
