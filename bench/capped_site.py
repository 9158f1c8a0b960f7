#!/usr/bin/env python3
"""The whole site under one memory cap, chatting as a user does. A benchmark and a demo, not a test.

    .venv/bin/python bench/capped_site.py --model PATH --cap-gb 4 [--turns 10] [--words 400]
                                          [--max-tokens 48] [--ctx 8192] [--json FILE]

It runs `make run` (supervisord: Daphne, the bridge with its engine, the Celery worker) and a
Redis of its own inside one cgroup v1 memory group limited to --cap-gb, with no memory setting
for the engine: the engine sizes its one budget from that limit, less what the site's other
processes hold at its start. PostgreSQL is the machine's, outside the group, as a deployment's
database is. Then it signs in through the login form as a user, opens /ws/chat/ as the page does,
and sends --turns long messages (--words words each, from Python's own help topics, so no two turns
share text) in ONE conversation, so each turn's prompt is the whole history so far.

Per turn it prints the prompt tokens, the time from send to the first answer text (as the page sees
it), decode tok/s and the expert hit rate (the engine's own figures, from the stored message), and
the group's peak so far. At the end: the engine's restarts (/health), the processes of the group
that changed pid (a process supervisord restarted: an OOM kill would show here even when the bridge
restarted with it), the group's OOM kills, the peak against the cap, and the budget split /health
reports. Exit status 0 only when every turn completed, nothing restarted and nothing was OOM-killed.

Needs root (the cgroup) and the machine's PostgreSQL; `DATABASE_URL` defaults to a database of
its own (colibri_capped, created here).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from scale import Cgroup, prompt_text  # noqa: E402  (the cgroup v1 group and the prompt corpus)

from tests.support import procs  # noqa: E402

USER, PASSWORD = "capped-bench", "capped-bench-password-1"
MIB = 1 << 20


def start_site(args, cg: Cgroup, port: int, redis_port: int, env: dict[str, str]) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A Redis of its own and `make run`, both inside the group (their children inherit it)."""
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", "/tmp"], stdout=subprocess.DEVNULL,
                             preexec_fn=cg.enter_fn())
    procs.wait_for_port(redis_port, redis)
    log = open(args.log, "w")
    site = subprocess.Popen(["make", "run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: (os.setsid(), cg.enter_fn()()))
    return redis, site


def manage(env: dict[str, str], code: str) -> None:
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "shell", "-c", code],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def ensure_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    base = url.rsplit("/", 1)[0] + "/postgres"
    r = subprocess.run(["psql", base, "-tAc", f"SELECT 1 FROM pg_database WHERE datname='{name}'"],
                       capture_output=True, text=True)
    if r.stdout.strip() != "1":
        subprocess.run(["psql", base, "-c", f'CREATE DATABASE "{name}"'], check=True, stdout=subprocess.DEVNULL)


def wait_ready(url: str, site: subprocess.Popen, timeout: float) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if site.poll() is not None:
            raise SystemExit(f"make run exited ({site.returncode}) before the site was up; see the log")
        try:
            r = httpx.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return r.json()
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"/health not 200 after {timeout:.0f} s")


def sign_in(url: str) -> str:
    """The session cookie, through the login form as a browser gets it (CSRF token included)."""
    with httpx.Client(base_url=url, timeout=30, follow_redirects=False) as http:
        page = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        if not token:
            raise SystemExit("no CSRF token on the login page")
        r = http.post("/accounts/login/", data={"username": USER, "password": PASSWORD,
                                                "csrfmiddlewaretoken": token.group(1)},
                      headers={"Referer": url + "/accounts/login/"})
        if r.status_code != 302 or "sessionid" not in http.cookies:
            raise SystemExit(f"sign-in failed: {r.status_code}")
        return http.cookies["sessionid"]


def group_pids(cg: Cgroup) -> dict[int, str]:
    out = {}
    for pid in (cg.dir / "cgroup.procs").read_text().split():
        try:
            out[int(pid)] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
        except OSError:
            pass
    return out


async def chat(args, url: str, cookie: str, cg: Cgroup) -> list[dict]:
    ws_url = url.replace("http://", "ws://") + "/ws/chat/"
    rows: list[dict] = []
    async with websockets.connect(ws_url, origin=url, additional_headers={"Cookie": f"sessionid={cookie}"},
                                  open_timeout=30, max_size=None) as ws:
        conversation = None
        for turn in range(args.turns):
            words = prompt_text(args.words * 4, offset=turn * args.words * 8).split()[:args.words]
            text = f"Turn {turn + 1}. Read this and say in one sentence what it is about:\n" + " ".join(words)
            t0 = time.monotonic()
            await ws.send(json.dumps({"type": "send", "conversation": conversation, "text": text,
                                      "params": {"max_tokens": args.max_tokens, "temperature": 0}}))
            first, done = None, None
            while done is None:
                frame = json.loads(await asyncio.wait_for(ws.recv(), args.turn_timeout))
                kind = frame["type"]
                if kind == "conversation":
                    conversation = frame["conversation"]["id"]
                elif kind in ("delta", "thinking") and first is None:
                    first = time.monotonic() - t0
                elif kind == "error":
                    done = {"status": "error", "stats": {}, "error": frame}
                elif kind == "done":
                    done = frame["message"]
            stats = done.get("stats") or {}
            row = {"turn": turn + 1, "status": done.get("status"), "prompt_tokens": stats.get("prompt_tokens"),
                   "completion_tokens": stats.get("completion_tokens"), "first_text_s": first,
                   "engine_ttft_s": stats.get("ttft_s"), "tok_s": stats.get("tok_s"), "hit_pct": stats.get("hit_pct"),
                   "peak_mib": cg.peak() / MIB, "error": done.get("error")}
            rows.append(row)
            print(f"turn {row['turn']:2d}  {row['status']:<10} prompt {row['prompt_tokens'] or 0:5d} tok  "
                  f"first text {fmt(first)} s  decode {fmt(row['tok_s'])} tok/s  hit {fmt(row['hit_pct'], '.1f')} %  "
                  f"peak {row['peak_mib']:.0f} MiB", flush=True)
            if row["status"] != "complete":
                break
    return rows


def fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def stop_site(site: subprocess.Popen, redis: subprocess.Popen) -> None:
    for proc, sig in ((site, signal.SIGTERM), (redis, signal.SIGTERM)):
        try:
            os.killpg(proc.pid, sig) if proc is site else proc.send_signal(sig)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with_kill = os.killpg if proc is site else os.kill
            try:
                with_kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cap-gb", type=float, required=True)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--words", type=int, default=400, help="words per user message")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--turn-timeout", type=float, default=900)
    ap.add_argument("--log", default="/tmp/capped_site.log", help="make run's output")
    ap.add_argument("--json", help="append the sitting's record to this file (JSON lines)")
    args = ap.parse_args()

    port, redis_port = procs.free_port(), procs.free_port()
    url = f"http://127.0.0.1:{port}"
    db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/colibri_capped")
    ensure_database(db)
    env = {**os.environ, "ENGINE_MODEL": str(Path(args.model).resolve()), "PORT": str(port), "CTX": str(args.ctx),
           "KV_SLOTS": str(args.slots), "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "DATABASE_URL": db,
           "COLIBRI_DEV": "1", "RUN_DIR": f"/tmp/capped-site-{os.getpid()}"}
    env.pop("ENGINE_ENV", None)  # no memory setting: the engine sizes itself from the group's limit
    cg = Cgroup("site", int(args.cap_gb * (1 << 30)))
    redis, site = start_site(args, cg, port, redis_port, env)
    record: dict = {"model": args.model, "cap_gb": args.cap_gb, "turns": args.turns, "words": args.words}
    try:
        t0 = time.monotonic()
        health = wait_ready(url, site, args.ready_timeout)
        record["ready_s"] = time.monotonic() - t0
        record["budget"] = health.get("memory")
        print(f"site up {record['ready_s']:.1f} s after `make run`; budget {json.dumps(health.get('memory'))}", flush=True)
        manage(env, "from django.contrib.auth import get_user_model as g; U=g(); "
                    f"u=U.objects.filter(username='{USER}').first() or U(username='{USER}'); "
                    f"u.set_password('{PASSWORD}'); u.save()")
        before = group_pids(cg)
        rows = asyncio.run(chat(args, url, sign_in(url), cg))
        after = group_pids(cg)
        health = httpx.get(url + "/health", timeout=10).json()
        gone = sorted(cmd for pid, cmd in before.items() if pid not in after)
        record.update(rows=rows, restarts=health.get("restarts"), replaced=gone, oom_kills=cg.oom_kills() - cg.oom0,
                      peak_mib=cg.peak() / MIB, cap_mib=args.cap_gb * 1024)
    finally:
        stop_site(site, redis)
        cg.remove()
    ok = (len(rows) == args.turns and all(r["status"] == "complete" for r in rows) and not record["replaced"]
          and record["restarts"] == 0 and record["oom_kills"] == 0)
    print(f"\n{len(rows)} turns, {'all complete' if ok else 'NOT all complete'}; engine restarts {record['restarts']}; "
          f"processes replaced {len(record['replaced'])} {record['replaced'] or ''}; OOM kills {record['oom_kills']}; "
          f"peak {record['peak_mib']:.0f} MiB of a {record['cap_mib']:.0f} MiB cap "
          f"({100 * record['peak_mib'] / record['cap_mib']:.1f} %)")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
