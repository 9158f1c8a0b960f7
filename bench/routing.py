#!/usr/bin/env python3
"""What routing adds to a generation's first token (issue 26 item 6; a benchmark, not a test).

    .venv/bin/python bench/routing.py [--bridges 3] [--rounds 400] [--prompt-chars 4000] [--model PATH]

Starts --bridges real bridges (manage.py run_bridge, each with the engine on the fixture model
or --model; KV_SLOTS=4) on a Redis database of its own, fills their slots with conversations
(two conversations per bridge, so registrations carry prefix chains of --prompt-chars characters), then interleaves,
round by round, in one process and one event loop:

* route:  what generate() now does before its submit (client._admissible): the registry snapshot
  in one round trip (a Lua script over every bridge's registration and heartbeat), the prompt's
  prefix chain, routing.route;
* legacy: what it did before the registry (liveness.aget_boot: one GET of the heartbeat);
* chain / decide: the pure parts alone (the prompt's chain; route() over the snapshot);
* served / served-legacy: the served model's facts an API request reads first, now
  (served.aserved_model_get(model): the registry, then that model's bridge's state) and before
  (telemetry.aget_state_and_boot: one MGET of the state and the heartbeat).

Prints the median and p90 of each in ms, `added` = route − legacy: the first-token time that
routing adds to generate() (target ≤ 2 ms), and `added (API)` with the served read too. Then the end-to-end first text of generate() (submit → first text
event), for scale.

    .venv/bin/python bench/routing.py --aggregate [--bridges 3] [--model models/smollm2-135m-moe16.gguf]
                                      [--per-bridge 4] [--turns 3] [--max-tokens 48] [--repeats 3] [--threads N]

Aggregate throughput with 1, 2, ... --bridges bridges on this machine (one started after each
step; the same model on each): --per-bridge conversations per running bridge (its KV_SLOTS), each
--turns turns long, all at once; a returning turn names its conversation and extends its prompt by
the answer, as the chat page does. Prints per step the aggregate completion tok/s (tokens of all
turns ÷ wall time), its ratio to one bridge's, the median first-text time, and affinity under
that load: the share of returning turns routed to the bridge that served the conversation's
first turn. --repeats steps of each size (1, 2, 3, 1, 2, 3, ...), medians.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    return f"median {statistics.median(ordered) * 1000:7.3f} ms   p90 {ordered[int(len(ordered) * 0.9)] * 1000:7.3f} ms"


def _start_bridges(args: argparse.Namespace, redis_url: str, model: Path) -> list:
    from tests.support import procs

    engine = procs.build_engine()
    env = {"REDIS_URL": redis_url, "ENGINE_BINARY": str(engine), "ENGINE_MODEL": str(model), "KV_SLOTS": "4",
           "CTX": "8192", "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "LOG_LEVEL": "WARNING"}
    return [procs.start_bridge({**env, "BRIDGE_ID": f"bench{i}"}) for i in range(args.bridges)]


async def _warm(args: argparse.Namespace, model_id: str) -> list[tuple[str, str]]:
    """Two conversations per bridge (half its slots: p2c need not pack them perfectly), each a
    long prompt: (conversation key, prompt)."""
    from engine_bridge.client import generate
    from engine_bridge.request import GenerationRequest

    conversations = []
    for n in range(args.bridges * 2):
        key = f"conv:bench{n}"
        prompt = CHATML.format(f"conversation {n}: " + "lorem ipsum dolor sit amet " * (args.prompt_chars // 27))
        async with contextlib.aclosing(generate(GenerationRequest(prompt=prompt, max_tokens=2, model=model_id,
                                                                  conversation_key=key))) as events:
            async for _ in events:
                pass
        conversations.append((key, prompt))
    await asyncio.sleep(0.2)  # the last registrations are written
    return conversations


async def _measure(args: argparse.Namespace, model_id: str) -> None:
    from engine_bridge import client, liveness, registry, routing, served, telemetry
    from engine_bridge.client import generate
    from engine_bridge.request import GenerationRequest

    conversations = await _warm(args, model_id)
    samples: dict[str, list[float]] = {"route": [], "legacy": [], "chain": [], "decide": [],
                                       "served": [], "served-legacy": []}
    for n in range(args.rounds):
        key, prompt = conversations[n % len(conversations)]
        request = GenerationRequest(prompt=prompt + "more<|im_end|>\n", max_tokens=1, model=model_id,
                                    conversation_key=key if n % 2 else None)  # half by key, half by prefix
        t0 = time.perf_counter()
        await liveness.aget_boot("bench0")
        t1 = time.perf_counter()
        target, _ = await client._admissible(request, None)
        t2 = time.perf_counter()
        assert target is not None
        samples["legacy"].append(t1 - t0)
        samples["route"].append(t2 - t1)
        bridges = await registry.abridges_get()
        t3 = time.perf_counter()
        chain = client._prompt_chain(request.prompt, bridges, model_id)
        t4 = time.perf_counter()
        routing.route(bridges, model_id, conversation_key=request.conversation_key, prompt_chain=chain)
        t5 = time.perf_counter()
        samples["chain"].append(t4 - t3)
        samples["decide"].append(t5 - t4)
        await served.aserved_model_get(model_id)
        t6 = time.perf_counter()
        await telemetry.aget_state_and_boot("bench0")
        t7 = time.perf_counter()
        samples["served"].append(t6 - t5)
        samples["served-legacy"].append(t7 - t6)
    added = [r - legacy for r, legacy in zip(samples["route"], samples["legacy"])]
    added_api = [r - legacy + m - old for r, legacy, m, old in
                 zip(samples["route"], samples["legacy"], samples["served"], samples["served-legacy"])]
    print(f"{args.bridges} bridges, {len(conversations)} warm conversations of ~{args.prompt_chars} chars, "
          f"{args.rounds} rounds (interleaved)")
    for name in ("legacy", "route", "chain", "decide", "served-legacy", "served"):
        print(f"  {name:13s} {_ms(samples[name])}")
    print(f"  added         {_ms(added)}   (generate: route - legacy, per round; target <= 2 ms)")
    print(f"  added (API)   {_ms(added_api)}   (with the served model's facts read before it: "
          "served + route - served-legacy - legacy)")
    ttft = []
    for n in range(min(args.rounds, 60)):
        key, prompt = conversations[n % len(conversations)]
        t0 = time.perf_counter()
        async with contextlib.aclosing(generate(GenerationRequest(prompt=prompt + f"again {n}<|im_end|>\n",
                                                                  max_tokens=2, model=model_id,
                                                                  conversation_key=key))) as events:
            async for event in events:
                if event is not None and event["kind"] == "text":
                    ttft.append(time.perf_counter() - t0)
                    break
    print(f"  end-to-end first text of generate(): {_ms(ttft)}")


async def _conversation(n: int, model_id: str, turns: int, max_tokens: int, tag: str) -> tuple[int, list[str], list[float]]:
    """One conversation of `turns` turns: (completion tokens, the bridge of each turn, first-text times)."""
    from engine_bridge.client import generate
    from engine_bridge.request import GenerationRequest

    key, history, tokens, bridges, firsts = f"conv:agg{tag}-{n}", "", 0, [], []
    for turn in range(turns):
        history += CHATML.format(f"[{tag}/{n}] Tell me something about the number {n * 10 + turn}.")
        t0, answer = time.perf_counter(), ""
        async with contextlib.aclosing(generate(GenerationRequest(prompt=history, max_tokens=max_tokens,
                                                                  model=model_id, conversation_key=key))) as events:
            async for event in events:
                if event is None:
                    continue
                if event["kind"] == "routed":
                    bridges.append(event["bridge"])
                elif event["kind"] == "text":
                    if not answer:
                        firsts.append(time.perf_counter() - t0)
                    answer += event["text"]
                elif event["kind"] == "done":
                    tokens += event["usage"]["completion_tokens"]
                elif event["kind"] == "error":
                    raise RuntimeError(event)
        history += answer + "<|im_end|>\n"
    return tokens, bridges, firsts


async def _aggregate_step(k: int, args: argparse.Namespace, model_id: str, tag: str) -> tuple[float, float, float]:
    """(aggregate tok/s, median first text s, affinity share) of k bridges' worth of conversations."""
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_conversation(n, model_id, args.turns, args.max_tokens, tag)
                                     for n in range(k * args.per_bridge)))
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    returning = [(b[0], later) for _, b, _ in results for later in b[1:]]
    kept = sum(first == later for first, later in returning) / max(len(returning), 1)
    return tokens / wall, statistics.median(f for _, _, fs in results for f in fs), kept


def _aggregate(args: argparse.Namespace, redis_url: str, model: Path, model_id: str) -> None:
    from tests.support import procs

    engine = procs.build_engine()
    env = {"REDIS_URL": redis_url, "ENGINE_BINARY": str(engine), "ENGINE_MODEL": str(model),
           "KV_SLOTS": str(args.per_bridge), "CTX": "4096",
           "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0" + (f",OMP_NUM_THREADS={args.threads}" if args.threads else ""),
           "LOG_LEVEL": "WARNING"}
    bridges, rows = [], {}
    try:
        for i in range(args.bridges):
            bridges.append(procs.start_bridge({**env, "BRIDGE_ID": f"agg{i}"}))
        for rep in range(args.repeats):
            for k in range(1, args.bridges + 1):
                # only the first k bridges in the rotation: the others are stopped (SIGSTOP), so
                # they take no work and no CPU, and their registrations age out of the rotation
                for i, proc in enumerate(bridges):
                    _signal_tree(proc.pid, signal.SIGCONT if i < k else signal.SIGSTOP)
                time.sleep(args.settle)
                row = asyncio.run(_aggregate_step(k, args, model_id, f"{rep}.{k}"))
                rows.setdefault(k, []).append(row)
                print(f"  repeat {rep + 1}, {k} bridge(s): {row[0]:7.1f} tok/s, first text {row[1] * 1000:6.1f} ms, "
                      f"affinity {row[2] * 100:5.1f} %", flush=True)
    finally:
        for proc in bridges:
            _signal_tree(proc.pid, signal.SIGCONT)
            procs.stop(proc)
    one = statistics.median(r[0] for r in rows[1])
    print(f"\n{model.name}, {args.per_bridge} conversations per bridge of {args.turns} turns, max_tokens "
          f"{args.max_tokens}, {args.repeats} repeats, medians; {os.cpu_count()} CPUs, "
          f"{args.threads or os.cpu_count()} engine threads each\n")
    print("| bridges | conversations | aggregate tok/s | × one bridge | first text ms | returning turns on their bridge |")
    print("|---|---|---|---|---|---|")
    for k, vals in rows.items():
        rate = statistics.median(v[0] for v in vals)
        print(f"| {k} | {k * args.per_bridge} | {rate:.1f} | {rate / one:.2f} | "
              f"{statistics.median(v[1] for v in vals) * 1000:.0f} | {statistics.median(v[2] for v in vals) * 100:.1f} % |")


def _signal_tree(pid: int, sig: int) -> None:
    """sig to a bridge and its engine (its children)."""
    try:
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:
        children = []
    for p in [pid, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bridges", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--prompt-chars", type=int, default=4000)
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the generated fixture model)")
    parser.add_argument("--aggregate", action="store_true", help="aggregate tok/s with 1..--bridges bridges")
    parser.add_argument("--per-bridge", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="each engine's threads (default: all cores)")
    parser.add_argument("--settle", type=float, default=4.0,
                        help="seconds after stopping/continuing bridges (a stopped one leaves the rotation)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "colibri_site.settings")
    os.environ.setdefault("COLIBRI_DEV", "1")
    from tests.support import procs

    redis_url = procs.claim_redis_db()
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()
    from engine_bridge.served import slugify

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or procs.make_tiny_model(Path(tmp) / "tiny-bench.gguf")
        if args.aggregate:
            try:
                _aggregate(args, redis_url, model, slugify(model.stem))
            finally:
                procs.release_redis_db(redis_url)
            return
        bridges = _start_bridges(args, redis_url, model)
        try:
            asyncio.run(_measure(args, slugify(model.stem)))
        finally:
            for proc in bridges:
                procs.stop(proc)
            procs.release_redis_db(redis_url)


if __name__ == "__main__":
    main()
