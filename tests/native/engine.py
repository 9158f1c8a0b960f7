"""A small driver for the native engine's mux protocol, for the tests in tests/native.

The engine runs as a child process; one reader thread parses its stdout (lines, plus
byte-counted DATA/TOOL/ECHO payloads read by count) and one thread collects stderr.
Every wait is bounded by a deadline, so a hung engine fails a test instead of hanging it.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

READY = b"\x01\x01READY\x01\x01\n"
ROOT = Path(__file__).resolve().parents[2]
ASAN = "build-asan" in os.environ.get("COLIBRI_ENGINE", "")
# Sanitizer builds are several times slower: scale every deadline.
SCALE = float(os.environ.get("COLIBRI_TEST_TIMEOUT_SCALE", "4" if ASAN else "1"))
T = 20.0 * SCALE  # default deadline for one wait (seconds)

SANITIZER_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "ERROR: ThreadSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")

_ids = itertools.count(1000)


def new_id() -> int:
    return next(_ids)


def chatml(user: str, system: str | None = None) -> str:
    s = ""
    if system is not None:
        s += f"<|im_start|>system\n{system}<|im_end|>\n"
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def base_env(model, slots=4, ctx=512, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        SERVE="1", SERVE_BATCH="1", SNAP=str(model), KV_SLOTS=str(slots), CTX=str(ctx),
        USAGE_SAVE="0", KVSAVE="0", COLI_NO_OMP_TUNE="1",
    )
    env.setdefault("OMP_NUM_THREADS", "2")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "COLI_USAGE" in extra:  # the usage-file path under both names engines use
        extra.setdefault("USAGE_FILE", extra["COLI_USAGE"])
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


class EngineError(AssertionError):
    pass


@dataclass
class Request:
    id: int
    accept: list[str] | None = None          # fields after "ACCEPT <id>"
    data: list[bytes] = field(default_factory=list)
    done: list[str] | None = None            # fields after "DONE <id>"
    errors: list[list[str]] = field(default_factory=list)   # [CODE, args...]
    block: list[str] = field(default_factory=list)          # id-less lines since the previous DONE
    perf: list[str] | None = None
    first_event: int | None = None           # index in Engine.events
    last_event: int | None = None

    @property
    def text(self) -> bytes:
        return b"".join(self.data)

    @property
    def finished(self) -> bool:
        # NOT_FOUND / DUPLICATE_ID answer a command about this id without ending it.
        return self.done is not None or any(e[0] not in ("NOT_FOUND", "DUPLICATE_ID") for e in self.errors)

    @property
    def codes(self) -> list[str]:
        return [e[0] for e in self.errors]

    @property
    def prompt_tokens(self) -> int:
        return int(self.accept[0])

    @property
    def reused(self) -> int | None:
        for f in (self.accept or [])[1:]:
            if f.startswith("reused="):
                return int(f.split("=", 1)[1])
        return None

    def stat(self) -> dict:
        """DONE <id> STAT <emitted> <tok_s> <hit_pct> <rss_gb> <prompt_tokens> <length_limited>"""
        d = self.done
        assert d is not None, f"request {self.id}: no DONE"
        assert d[0] == "STAT" and len(d) == 7, f"DONE {self.id} {' '.join(d)}: expected STAT + 6 fields"
        return dict(emitted=int(d[1]), tok_s=float(d[2]), hit_pct=float(d[3]), rss_gb=float(d[4]),
                    prompt_tokens=int(d[5]), length_limited=int(d[6]))

    def block_line(self, kind: str) -> str | None:
        for ln in reversed(self.block):
            if ln.split(" ", 1)[0] == kind:
                return ln
        return None


class Engine:
    """One engine process speaking mux on pipes."""

    def __init__(self, binary, model=None, *, slots=4, ctx=512, env=None, args=(),
                 wait_ready=True, ready_timeout=None):
        self.binary = str(binary)
        self.env = env if env is not None else base_env(model, slots, ctx)
        self.slots = int(self.env.get("KV_SLOTS", slots))
        self.proc = subprocess.Popen([self.binary, *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=self.env)
        self.cond = threading.Condition()
        self.banner: list[bytes] = []
        self.ready = False
        self.eof = False
        self.events: list[tuple[str, list[str], bytes | None]] = []   # (kind, fields, payload)
        self.reqs: dict[int, Request] = {}
        self.errors0: list[list[str]] = []
        self.pending: list[str] = []
        self.latest: dict[str, str] = {}
        self.violations: list[str] = []
        self._stderr = bytearray()
        self._wlock = threading.Lock()
        self._tr = threading.Thread(target=self._read_stdout, daemon=True)
        self._te = threading.Thread(target=self._read_stderr, daemon=True)
        self._tr.start()
        self._te.start()
        if wait_ready:
            self.wait(lambda: self.ready, ready_timeout or T, "READY")

    # ---------------------------------------------------------------- reader threads
    def _read_stderr(self):
        while True:
            b = self.proc.stderr.read1(65536)
            if not b:
                return
            with self.cond:
                self._stderr += b
                self.cond.notify_all()

    def _read_stdout(self):
        f = self.proc.stdout
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                if line == READY:
                    with self.cond:
                        self.ready = True
                        self.cond.notify_all()
                    break
                self.banner.append(line)
            while True:
                line = f.readline()
                if not line:
                    return
                if not line.endswith(b"\n"):
                    self._violate(f"unterminated last line {line!r}")
                    return
                payload = None
                try:
                    text = line[:-1].decode("utf-8")
                except UnicodeDecodeError:
                    self._violate(f"non-UTF-8 protocol line {line!r}")
                    text = line[:-1].decode("utf-8", "replace")
                parts = text.split(" ")
                kind = parts[0]
                if kind in ("DATA", "TOOL", "ECHO"):
                    try:
                        n = int(parts[2])
                        assert 0 <= n <= 65536
                    except (IndexError, ValueError, AssertionError):
                        self._violate(f"bad {kind} header {text!r}")
                        return
                    payload = self._read_exact(f, n)
                    nl = self._read_exact(f, 1)
                    if payload is None or nl != b"\n":
                        self._violate(f"{kind} frame {text!r}: payload {payload!r} not followed by \\n (got {nl!r})")
                        return
                with self.cond:
                    self._dispatch(kind, parts, text, payload)
                    self.cond.notify_all()
        finally:
            with self.cond:
                self.eof = True
                self.cond.notify_all()

    @staticmethod
    def _read_exact(f, n):
        buf = b""
        while len(buf) < n:
            b = f.read(n - len(buf))
            if not b:
                return None
            buf += b
        return buf

    def _violate(self, msg):
        with self.cond:
            self.violations.append(msg)
            self.cond.notify_all()

    def _req(self, rid: int) -> Request:
        r = self.reqs.get(rid)
        if r is None:
            r = self.reqs[rid] = Request(rid)
        return r

    def _dispatch(self, kind, parts, text, payload):
        idx = len(self.events)
        self.events.append((kind, parts, payload))
        rid = None
        if kind in ("ACCEPT", "DATA", "DONE", "ERROR", "PERF", "TOPK", "TOOL", "ECHO"):
            try:
                rid = int(parts[1])
            except (IndexError, ValueError):
                self.violations.append(f"line without a valid id: {text!r}")
                return
        if kind == "ERROR" and rid == 0:
            self.errors0.append(parts[2:])
            return
        if rid is not None:
            r = self._req(rid)
            if r.first_event is None:
                r.first_event = idx
            r.last_event = idx
            if kind == "ACCEPT":
                if r.accept is not None:
                    self.violations.append(f"second ACCEPT for {rid}: {text!r}")
                if r.data:
                    self.violations.append(f"ACCEPT after DATA for {rid}")
                r.accept = parts[2:]
            elif kind == "DATA":
                if r.accept is None:
                    self.violations.append(f"DATA before ACCEPT for {rid}")
                if r.done is not None:
                    self.violations.append(f"DATA after DONE for {rid}")
                r.data.append(payload)
            elif kind == "DONE":
                if r.done is not None:
                    self.violations.append(f"second DONE for {rid}")
                r.done = parts[2:]
                r.block = self.pending
                self.pending = []
            elif kind == "ERROR":
                r.errors.append(parts[2:])
            elif kind == "PERF":
                r.perf = parts[2:]
            return
        self.pending.append(text)
        self.latest[kind] = text

    # ---------------------------------------------------------------- waiting
    def stderr_text(self) -> str:
        with self.cond:
            return self._stderr.decode("utf-8", "replace")

    def wait_stderr(self, text: str, timeout=None) -> str:
        """Waits until `text` has appeared on the engine's stderr (read by its own thread, so a
        line the engine wrote before answering on stdout may not be here yet); returns stderr."""
        deadline = time.monotonic() + (T if timeout is None else timeout)
        with self.cond:
            while text.encode("utf-8") not in self._stderr:
                left = deadline - time.monotonic()
                if left <= 0 or (self.eof and self.proc.poll() is not None and not self._te.is_alive()):
                    raise EngineError(f"{text!r} never appeared on stderr{self._diag()}")
                self.cond.wait(min(left, 0.5))
            return self._stderr.decode("utf-8", "replace")

    def _diag(self) -> str:
        tail = [f"{k} {' '.join(p[1:])}"[:200] for k, p, _ in self.events[-15:]]
        err = self.stderr_text()[-2000:]
        return (f"\n  returncode={self.proc.poll()} eof={self.eof}\n  last stdout lines:\n    "
                + "\n    ".join(tail) + f"\n  stderr tail:\n{err}")

    def wait(self, pred, timeout=None, what="condition"):
        timeout = T if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if pred():
                    return
                if self.violations:
                    raise EngineError(f"protocol violation: {self.violations}{self._diag()}")
                if self.eof:
                    raise EngineError(f"engine stdout closed while waiting for {what}{self._diag()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise EngineError(f"timed out after {timeout:.0f}s waiting for {what}{self._diag()}")
                self.cond.wait(min(left, 0.5))

    # ---------------------------------------------------------------- commands
    def write(self, data: bytes):
        with self._wlock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def submit(self, payload, slot=0, max_tokens=16, temperature=0, top_p=1, rid=None, extra="", write=True):
        """Sends SUBMIT; returns the id (or the frame when write=False)."""
        rid = new_id() if rid is None else rid
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        frame = f"SUBMIT {rid} {slot} {len(payload)} {max_tokens} {temperature} {top_p}{extra}\n".encode() + payload + b"\n"
        with self.cond:
            self._req(rid)
        if not write:
            return rid, frame
        self.write(frame)
        return rid

    def stop(self, rid):
        self.write(f"STOP {rid}\n".encode())

    def cancel(self, rid):
        self.write(f"CANCEL {rid}\n".encode())

    def result(self, rid, timeout=None) -> Request:
        """Waits until the request has DONE or a terminal ERROR."""
        r = self._req(rid)
        self.wait(lambda: r.finished, timeout, f"DONE/ERROR of request {rid}")
        return r

    def generate(self, payload, slot=0, max_tokens=16, temperature=0, top_p=1, timeout=None) -> Request:
        rid = self.submit(payload, slot, max_tokens, temperature, top_p)
        r = self.result(rid, timeout)
        assert r.done is not None, f"request {rid} failed: {r.errors}{self._diag()}"
        return r

    def mark(self) -> int:
        """Position in the ERROR 0 list, to pass to sync(since=...) before writing a command."""
        with self.cond:
            return len(self.errors0)

    def sync(self, timeout=None, since=None):
        """Round-trips a harmless command (STOP of an unknown id -> NOT_FOUND); returns the
        ERROR 0 lines seen (since `since`, else since this call) before the answer."""
        rid = new_id()
        n0 = self.mark() if since is None else since
        r = self._req(rid)
        self.stop(rid)
        self.wait(lambda: r.errors, timeout, f"NOT_FOUND for sync probe {rid}")
        assert r.errors[0][0] == "NOT_FOUND", f"sync probe STOP {rid} answered {r.errors}"
        return self.errors0[n0:]

    def active(self) -> list[int]:
        with self.cond:
            return [i for i, r in self.reqs.items() if r.accept is not None and not r.finished]

    # ---------------------------------------------------------------- shutdown
    def close_stdin(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def wait_exit(self, timeout=None) -> int:
        try:
            rc = self.proc.wait(T if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            raise EngineError(f"engine did not exit within {timeout}s{self._diag()}")
        self._tr.join(5)
        self._te.join(5)
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._te.join(2)
        self._tr.join(2)

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def check_clean(self):
        """Raises if the engine broke the protocol or a sanitizer reported something."""
        err = self.stderr_text()
        bad = [m for m in SANITIZER_MARKERS if m in err]
        if bad:
            raise EngineError(f"sanitizer report in engine stderr ({bad}):\n{err[-4000:]}")
        if self.violations:
            raise EngineError(f"protocol violations: {self.violations}")

    def close(self, timeout=None):
        """Graceful shutdown (EOF); kills on timeout. Returns the exit code."""
        self.close_stdin()
        try:
            rc = self.proc.wait(T if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise EngineError(f"engine did not exit after EOF{self._diag()}")
        self._tr.join(5)
        self._te.join(5)
        return rc


# ------------------------------------------------------------------ line parsers
HEX_RE = re.compile(r"^[0-9a-fA-F]*$")


def parse_map(line: str, kind: str):
    """EMAP/HITS <rows> <cols> <hex> -> (rows, cols, bytes)."""
    p = line.split(" ")
    if len(p) == 3 and p[0] == kind and int(p[1]) * int(p[2]) == 0:
        p.append("")  # "EMAP 0 0" of a dense model
    assert p[0] == kind and len(p) == 4, f"bad {kind} line {line!r}"
    rows, cols = int(p[1]), int(p[2])
    assert HEX_RE.match(p[3]) and len(p[3]) % 2 == 0, f"bad hex in {line!r}"
    return rows, cols, bytes.fromhex(p[3])


def parse_tiers(line: str):
    p = line.split(" ")
    assert p[0] == "TIERS" and len(p) == 6, f"bad TIERS line {line!r}"
    return int(p[1]), int(p[2]), int(p[3]), float(p[4]), float(p[5])


def parse_hwinfo(line: str):
    p = line.split(" ", 6)
    assert p[0] == "HWINFO" and len(p) == 7, f"bad HWINFO line {line!r}"
    cores, tot, avail, ngpu, vram = int(p[1]), float(p[2]), float(p[3]), int(p[4]), float(p[5])
    assert "|" in p[6], f"HWINFO without '|': {line!r}"
    return cores, tot, avail, ngpu, vram, p[6]


def hits_bits(hits: bytes, n: int) -> list[int]:
    """LSB-first bit list of length n."""
    return [(hits[i >> 3] >> (i & 7)) & 1 for i in range(n)]


def parse_model_line(line: str) -> dict:
    assert line.startswith("MODEL "), line
    return json.loads(line[6:])


def two_turns(binary, model, max_tokens, temperature=0.0, extra="", **env
                 ) -> tuple[tuple[bytes, bytes], tuple[Request, Request]]:
    """Two EXACT=1 turns of one conversation on slot 0 of a fresh engine, the second extending the
    first (it resumes the slot), greedy unless a temperature (and SUBMIT options such as a seed in
    `extra`) is given: ((text 1, text 2), (request 1, request 2))."""
    e = Engine(binary, env=base_env(model, slots=1, ctx=512, EXACT=1, **env))
    try:
        p1 = chatml("Tell me about the sea and the ships on it.").encode()
        r1 = e.result(e.submit(p1, slot=0, max_tokens=max_tokens, temperature=temperature, extra=extra))
        # a sampled reply of a random model may hold a NUL, which a SUBMIT payload may not
        p2 = p1 + r1.text.replace(b"\0", b"") + b"<|im_end|>\n" + chatml("And the harbours?").encode()
        r2 = e.result(e.submit(p2, slot=0, max_tokens=max_tokens, temperature=temperature, extra=extra))
        for r in (r1, r2):
            assert r.done is not None, r.errors
        return (r1.text, r2.text), (r1, r2)
    finally:
        try:
            e.close(10)
        finally:
            e.kill()
