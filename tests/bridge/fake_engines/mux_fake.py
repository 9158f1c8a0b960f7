#!/usr/bin/env python3
"""Test double: a small mux engine in Python (not a model). One byte of prompt = one token; the
"generated" text cycles through OUTPUT, two bytes per DATA frame so UTF-8 characters get split.

Env: KV_SLOTS, CTX as the real engine; FAKE_DELAY (seconds per token, default 0.005);
FAKE_BANNER=1 prints banner lines before READY; FAKE_UNKNOWN=1 sprinkles unknown line kinds;
FAKE_SCRIPT=1: a prompt holding `<<SAY>>text<</SAY>>` gets exactly the last such text (still two
bytes per frame) and then ends as at EOS (DONE not length-limited) — deterministic model output
for the wire tests (tool calls the tiny random model would never write); a continuation of it
says `<<THEN>>text<</THEN>>` (scripted()). FAKE_BUSY_PREFILL=S: after each ACCEPT, S seconds of
CPU work with no output and no reading of commands, as a real engine's long prefill under a small
memory budget (its forward does not read stdin).
"""
import os
import queue
import sys
import threading
import time

OUTPUT = "héllo wörld 🙂 ".encode()
OUT = sys.stdout.buffer
SLOTS = int(os.environ.get("KV_SLOTS", "1"))
CTX = int(os.environ.get("CTX", "4096"))
DELAY = float(os.environ.get("FAKE_DELAY", "0.005"))
UNKNOWN = os.environ.get("FAKE_UNKNOWN") == "1"
SCRIPT = os.environ.get("FAKE_SCRIPT") == "1"
BUSY_PREFILL = float(os.environ.get("FAKE_BUSY_PREFILL", "0"))
SAY, SAY_END = b"<<SAY>>", b"<</SAY>>"
THEN, THEN_END = b"<<THEN>>", b"<</THEN>>"


def scripted(prompt):
    """The last <<SAY>>...<</SAY>> text of the prompt, or None (cycle OUTPUT). A continuation (the
    prompt already holds the script's first 12 bytes after it: the bridge resubmitted the output
    so far, as a thinking budget does) gets the prompt's <<THEN>>...<</THEN>> text instead."""
    start = prompt.rfind(SAY)
    end = prompt.find(SAY_END, start + len(SAY)) if start >= 0 else -1
    if not SCRIPT or end < 0:
        return None
    script = prompt[start + len(SAY):end]
    if len(script) >= 12 and script[:12] in prompt[end:]:
        then = prompt.rfind(THEN)
        then_end = prompt.find(THEN_END, then + len(THEN)) if then >= 0 else -1
        return prompt[then + len(THEN):then_end] if then_end >= 0 else b""
    return script


def out(data):
    OUT.write(data)
    OUT.flush()


def line(text):
    out(text.encode() + b"\n")


def reader(commands):
    stdin = sys.stdin.buffer
    while True:
        header = stdin.readline()
        if not header:
            commands.put(("EOF",))
            return
        toks = header.decode().split()
        if toks and toks[0] == "SUBMIT" and len(toks) == 7:
            n = int(toks[3])
            payload = stdin.read(n)
            nl = stdin.read(1)
            commands.put(("SUBMIT", int(toks[1]), int(toks[2]), payload, int(toks[4]), nl))
        elif toks and toks[0] in ("STOP", "CANCEL") and len(toks) == 2:
            commands.put((toks[0], int(toks[1])))
        else:
            commands.put(("BAD",))


def block(emitted, prompt_tokens, rid, limited):
    line("HWINFO 2 24.7 23.3 0 0.0 Fake CPU @ 1.00GHz|")
    if UNKNOWN:
        line("FUTUREKIND 1 2 3")
    line("TIERS 0 11 5 0.00 0.00")
    line("EMAP 2 8 00000041414344450000434344444342")
    line("HITS 2 8 f8fc")
    line(f"PROF 0.019 {prompt_tokens} {emitted} 0.000 0.000 0.000 0.010 0.000 7")
    line(f"DONE {rid} STAT {emitted} 428.09 96.4 0.01 {prompt_tokens} {1 if limited else 0}")


def main(crash_after=None):
    if os.environ.get("FAKE_BANNER") == "1":
        line("== fake engine, cache=8 experts/layer ==")
        line("loaded in 0.00s | STAT not protocol yet")
    out(b"\x01\x01READY\x01\x01\n")
    line("STAT 0 0.00 0.0 0.01")
    line("HWINFO 2 24.7 23.3 0 0.0 Fake CPU @ 1.00GHz|")
    line("TIERS 0 0 16 0.00 0.00")
    line("EMAP 2 8 00000000000000000000000000000000")
    if os.environ.get("FAKE_NO_MODEL") != "1":  # like the real colibri binary, which sends none
        line('MODEL {"name": "fake-moe", "ctx": %d}' % CTX)
    if UNKNOWN:
        line("SOMETHINGNEW x=1")
    commands = queue.Queue()
    threading.Thread(target=reader, args=(commands,), daemon=True).start()
    history = [b""] * SLOTS
    active = {}  # id -> [slot, prompt, max_tokens, emitted, out bytes]
    eof = False
    while True:
        while True:
            if not active and not eof:
                cmd = commands.get()
            else:
                try:
                    cmd = commands.get_nowait()
                except queue.Empty:
                    break
            if cmd[0] == "EOF":
                eof = True
            elif cmd[0] == "BAD":
                line("ERROR 0 BAD_REQUEST")
            elif cmd[0] == "SUBMIT":
                _, rid, slot, payload, max_tokens, nl = cmd
                if nl != b"\n":
                    line(f"ERROR {rid} BAD_FRAME")
                    eof = True
                elif slot >= SLOTS:
                    line(f"ERROR {rid} BAD_REQUEST")
                elif any(a[0] == slot for a in active.values()):
                    line(f"ERROR {rid} SLOT_BUSY")
                elif len(payload) > CTX - 2:
                    line(f"ERROR {rid} CONTEXT_EXCEEDED {min(len(payload), CTX - 1)} {CTX - 2}")
                else:
                    old = history[slot]
                    reused = 0
                    while reused < min(len(old), len(payload)) and old[reused] == payload[reused]:
                        reused += 1
                    line(f"ACCEPT {rid} {len(payload)} reused={reused}")
                    busy_until = time.monotonic() + BUSY_PREFILL
                    while time.monotonic() < busy_until:  # computing, silent
                        sum(i * i for i in range(10000))
                    limit = min(max_tokens, CTX - len(payload) - 1)
                    active[rid] = [slot, payload, limit, 0, b"", scripted(payload)]
            else:
                verb, rid = cmd
                if rid not in active:
                    line(f"ERROR {rid} NOT_FOUND")
                elif verb == "CANCEL":
                    a = active.pop(rid)
                    history[a[0]] = a[1] + a[4]
                    line(f"ERROR {rid} CANCELLED")
                else:
                    a = active.pop(rid)
                    history[a[0]] = a[1] + a[4]
                    block(a[3], len(a[1]), rid, False)
        if eof and not active:
            return 0
        for rid, a in list(active.items()):
            if a[5] is not None and 2 * a[3] >= len(a[5]):  # the script is said: EOS
                del active[rid]
                history[a[0]] = a[1] + a[4]
                block(a[3], len(a[1]), rid, False)
                continue
            if a[5] is not None:
                chunk = a[5][2 * a[3]:2 * a[3] + 2]
            else:
                chunk = bytes(OUTPUT[(2 * a[3] + i) % len(OUTPUT)] for i in range(2))
            if crash_after is not None and a[3] == crash_after:
                out(b"DATA %d 5\nhe" % rid)
                os._exit(3)
            out(b"DATA %d %d\n" % (rid, len(chunk)) + chunk + b"\n")
            if UNKNOWN and a[3] == 0:
                line("NEWTHING 7")
            a[3] += 1
            a[4] += chunk
            if a[3] >= a[2]:
                del active[rid]
                history[a[0]] = a[1] + a[4]
                block(a[3], len(a[1]), rid, True)
        time.sleep(DELAY)


if __name__ == "__main__":
    sys.exit(main())
