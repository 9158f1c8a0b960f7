"""The asyncio owner of one engine process, and the supervisor that restarts it.

Engine: spawn, skip banner lines until READY (with a timeout), one reader task feeding the
protocol parser, stderr copied to the log, every command written as one write under a lock.
The reader owns the read end of the engine's stdout pipe and watches it only while it waits to
read: an engine writes a line per token, and a pipe watched all the time (asyncio's transports
read whatever arrives) wakes the bridge for each of them, preempting an engine thread on a small
host; during the owner's read pause (read_pause) the lines wait in the pipe and leave in one read.
A command written to the engine ends a pause at once, so its answer (ACCEPT, a first token,
CANCELLED) is read without waiting for the pause.
Supervisor: start an Engine, report its events, and when it dies or breaks the protocol (EOF,
ProtocolError, BAD_FRAME, ERROR 0) tell the owner, then restart with exponential backoff. The
backoff resets once an engine reaches READY and is capped at BACKOFF_MAX, so one crash costs
about a second and a crash loop costs at most BACKOFF_MAX between attempts.
An engine that refuses its model file at load (exit code EXIT_REFUSED, after a stderr line
"colibri-engine: refused PATH: REASON") is not restarted: the same file fails the same way. The
supervisor reports the reason (status "refused", on_refused) and starts again once the model file
changes (its size, time or inode), else after REFUSED_RETRY_S (what the file lacked may be the
host's: memory, a file system that was not mounted yet).
"""
import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from engine_bridge import protocol
from engine_bridge.request import GenerationRequest

log = logging.getLogger(__name__)

ROUTINE_STDERR = (b"[API] done id=", b"[API] KV slot ")
EXIT_REFUSED = 3  # the engine refused its model file at load (native/src/main.c)
REFUSED_LINE = b"colibri-engine: refused "
REFUSED_POLL_S = 2.0  # how often a refused model file is looked at for a change
REFUSED_RETRY_S = 300.0  # a retry after a refusal when the model file did not change
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 5.0
TERM_GRACE = 5.0
READ_SIZE = 1 << 18
PIPE_BYTES = 1 << 20  # room for what a fast engine writes during a read pause (Linux's default is 64 KiB)

# Request ids: one process-wide counter, never reused, so a late NOT_FOUND cannot hit a new request.
_ids = itertools.count(1)


def next_id() -> int:
    return next(_ids)


def engine_command() -> tuple[list[str], dict[str, str]]:
    """(argv, env) from settings: ENGINE_COMMAND (shlex) or [ENGINE_BINARY], plus ENGINE_ENV pairs."""
    argv = shlex.split(settings.ENGINE_COMMAND) if settings.ENGINE_COMMAND else [settings.ENGINE_BINARY]
    env = dict(os.environ)
    env.update(SERVE="1", SERVE_BATCH="1", SNAP=str(settings.ENGINE_MODEL),
               KV_SLOTS=str(settings.KV_SLOTS), CTX=str(settings.ENGINE_CTX))
    for pair in settings.ENGINE_ENV.split(","):
        key, sep, value = pair.strip().partition("=")
        if sep and key:
            env[key] = value
    nice = int(getattr(settings, "ENGINE_NICE", 0))
    if nice:  # exec'd by nice(1): the engine and every thread it starts run at that niceness
        argv = ["nice", "-n", str(nice), *argv]
    return argv, env


class EngineFailed(Exception):
    def __init__(self, reason: str, refusal: str | None = None) -> None:
        super().__init__(reason)
        self.refusal = refusal  # the engine's reason for refusing its model file, if it did


# (events the last read held, seconds since the read before) -> seconds to wait before the next read
ReadPause = Callable[[int, float], float]


class SupervisorHooks(Protocol):
    """What the Supervisor tells its owner (engine_bridge.worker.Bridge); `read_pause` and
    `on_start_failed` are optional and looked up by name."""

    def on_status(self, status: str, /) -> None: ...
    def on_ready(self, engine: "Engine", /) -> None: ...
    def on_event(self, event: protocol.Event, /) -> None: ...
    def on_down(self, reason: str, /) -> None: ...


@dataclass(frozen=True)
class ProcSample:
    """The engine process as /proc shows it at one moment (Engine.sample)."""
    # A figure that grows while the engine works: its CPU time in ticks plus the bytes it read
    # from storage. A long prefill under a small memory budget runs for minutes without a line on
    # stdout and without reading a command; this tells it from a hang. None: /proc cannot tell.
    work: int | None
    # Stopped (SIGSTOP, a debugger): /proc says so at once, where an unanswered ping takes a while.
    stopped: bool


class Engine:
    def __init__(self, argv: list[str], env: dict[str, str], on_event: Callable[[protocol.Event], object], slots: int,
                 read_pause: ReadPause | None = None) -> None:
        self.argv, self.env, self.on_event, self.slots = argv, env, on_event, slots
        # Seconds to wait before the next read of stdout, given how many events the last read
        # held and the seconds since the read before (the owner's pacing; 0 = read at once).
        self.read_pause = read_pause or (lambda events, cycle: 0.0)
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.exited: asyncio.Future[str] = asyncio.get_running_loop().create_future()  # result: reason (str)
        self.tasks: list[asyncio.Task[None]] = []
        self.broken: str | None = None
        self.model_info: dict | None = None
        self.stdout_fd: int | None = None
        self.wake = asyncio.Event()   # set by a write: the reader's pause ends
        self.refusal: str | None = None  # the reason of a "refused" stderr line (a model file refused at load)
        self.last_output = time.monotonic()  # when stdout last held something (the watchdog's clock)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, ready_timeout: float) -> None:
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError):  # F_SETPIPE_SZ is Linux's; elsewhere the default size
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        os.set_blocking(read_end, False)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdin=asyncio.subprocess.PIPE,
                stdout=write_end, stderr=asyncio.subprocess.PIPE)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        self.stdout_fd = read_end
        log.info("engine started: pid %s, %s", self.pid, shlex.join(self.argv))
        self.tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._stderr())]
        waiters: list[asyncio.Future[Any]] = [self.ready, self.exited]
        done, _ = await asyncio.wait(waiters, timeout=ready_timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if self.ready.done():
            return
        reason = self.exited.result() if self.exited.done() else f"no READY within {ready_timeout:g}s"
        await self.kill()  # (the stderr reader has read to the end: a refusal's line is in)
        refused = self.exited.done() and self.proc is not None and self.proc.returncode == EXIT_REFUSED
        raise EngineFailed(reason, (self.refusal or reason) if refused else None)

    async def _read(self) -> None:
        assert self.proc is not None and self.stdout_fd is not None  # started
        parser = protocol.Parser()
        reason, kill_now = "engine closed stdout", True
        try:
            loop = asyncio.get_running_loop()
            previous = loop.time()
            while True:
                chunk = await self._read_chunk()
                self.last_output = time.monotonic()
                if not chunk:
                    kill_now = False
                    break
                events = parser.feed(chunk)
                for event in events:
                    self._dispatch(event)
                if self.broken:
                    reason = self.broken
                    break
                # the events of one read cycle: since the previous read's events were handled (the
                # pause after them included, the idle wait before a request's first event too)
                now = loop.time()
                pause = self.read_pause(len(events), now - previous)
                previous = now
                if pause > 0:  # the pipe holds what the engine writes meanwhile
                    await self._pause(pause)
        except protocol.ProtocolError as exc:
            reason = f"protocol error: {exc}"
        except Exception as exc:  # a bug in an event handler must not leave requests hanging
            log.exception("engine reader failed")
            reason = f"reader failed: {exc!r}"
        finally:
            os.close(self.stdout_fd)
        if self.broken:
            reason = self.broken
        log.warning("engine pid %s: %s", self.pid, reason)
        if kill_now:
            self._signal(signal.SIGKILL)
        try:
            code = await asyncio.wait_for(self.proc.wait(), TERM_GRACE)
            reason = f"{reason} (exit code {code})"
        except asyncio.TimeoutError:
            self._signal(signal.SIGKILL)
            await self.proc.wait()
        if not self.exited.done():
            self.exited.set_result(reason)

    async def _read_chunk(self) -> bytes:
        """What the engine's stdout holds now (b"" at end of file), after waiting for it to hold
        something; between calls nothing watches the pipe."""
        loop = asyncio.get_running_loop()
        assert self.stdout_fd is not None  # started
        while True:
            try:
                return os.read(self.stdout_fd, READ_SIZE)
            except BlockingIOError:
                pass
            readable: asyncio.Future[None] = loop.create_future()

            def wake(readable: asyncio.Future[None] = readable) -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(self.stdout_fd, wake)
            try:
                await readable
            finally:
                loop.remove_reader(self.stdout_fd)

    async def _pause(self, seconds: float) -> None:
        """Waits `seconds`, or not at all or less when a command was written since the last pause
        (its answer may be due; the read after it may not have held it yet)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()
        self.wake.clear()

    def _dispatch(self, event: protocol.Event) -> None:
        if isinstance(event, protocol.Banner):
            log.info("engine banner: %s", event.text)
            return
        if isinstance(event, protocol.Model):
            self.model_info = event.info
        if isinstance(event, protocol.Ready):
            if not self.ready.done():
                self.ready.set_result(True)
            return
        if isinstance(event, protocol.Error) and (event.id == 0 or event.code == "BAD_FRAME"):
            # ERROR 0: the stream may be desynchronised; BAD_FRAME: the engine is about to exit.
            log.error("engine said ERROR %s %s; restarting it", event.id, event.message)
            self.broken = f"engine error {event.id} {event.message}"
        self.on_event(event)

    async def _stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None  # started with stderr=PIPE
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                return
            # The engine's two routine lines per request say what the bridge's own "req" line
            # says: debug, so a busy bridge writes one log line per request, not three.
            if line.startswith(REFUSED_LINE):  # "... refused PATH: REASON": the reason, as said
                text = line.decode("utf-8", "replace").rstrip()
                self.refusal = text.split(": ", 2)[-1] if text.count(": ") >= 2 else text
            level = logging.DEBUG if line.startswith(ROUTINE_STDERR) else logging.INFO
            if log.isEnabledFor(level):
                log.log(level, "engine: %s", line.decode("utf-8", "replace").rstrip())

    async def write(self, data: bytes) -> None:
        """send(), then wait until the pipe has taken what the transport kept."""
        async with self.lock:
            self.send(data)
            assert self.proc is not None and self.proc.stdin is not None  # send() checked it
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise EngineFailed(f"write failed: {exc!r}") from exc

    def send(self, data: bytes) -> None:
        """Writes a command at once, in order with every other command (the pipe's transport keeps
        what the pipe does not take yet; write() also waits for that to drain). So the first
        SUBMIT of a burst reaches the engine, which starts its prefill, while the bridge still
        admits the rest (a task per write sent them all after the last one's admission)."""
        assert self.proc is not None and self.proc.stdin is not None  # started with stdin=PIPE
        if self.broken or self.exited.done() or self.proc.stdin.is_closing():
            raise EngineFailed("engine is not accepting commands")
        try:
            self.proc.stdin.write(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise EngineFailed(f"write failed: {exc!r}") from exc
        self.wake.set()

    def submit_command(self, req_id: int, slot: int, job: GenerationRequest) -> bytes:
        # key=value extensions (seed=, experts=, routes=, heat=) go only to our engine (it sends a
        # MODEL line); the bridge refuses such a request for any other engine before it gets here.
        return protocol.format_submit(
            req_id, slot, job.prompt, job.max_tokens, job.temperature, job.top_p, slots=self.slots,
            seed=job.seed, experts=job.experts, routes=job.routes, route_steps=self.route_steps(job),
            heat=job.heat, top_k=job.top_k,
            logprobs=job.logprobs, grammar=job.grammar)

    def route_steps(self, job: GenerationRequest) -> bool:
        """Whether this job's routing comes with per-token steps (routes=2): asked for routing,
        from an engine whose MODEL line says it takes routes=2 (engine_bridge.route_phases)."""
        return job.routes and (self.model_info or {}).get("routes") == 2

    async def submit(self, req_id: int, slot: int, job: GenerationRequest) -> None:
        await self.write(self.submit_command(req_id, slot, job))

    async def stop(self, req_id: int) -> None:
        await self.write(protocol.format_stop(req_id))

    async def cancel(self, req_id: int) -> None:
        await self.write(protocol.format_cancel(req_id))

    def sample(self) -> ProcSample:
        """What /proc shows of the engine process now, from one read of its stat: the watchdog
        asks once per tick. Nothing readable (no process, no /proc): no work figure, not stopped."""
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return ProcSample(None, False)
        stopped = bool(fields) and fields[0] in ("T", "t")
        try:
            ticks = int(fields[11]) + int(fields[12])  # utime, stime (every thread's)
        except (IndexError, ValueError):
            return ProcSample(None, stopped)
        return ProcSample(ticks + self._read_bytes(), stopped)

    def _read_bytes(self) -> int:
        """The bytes the engine read from storage (/proc/<pid>/io read_bytes); 0 when unreadable."""
        try:
            with open(f"/proc/{self.pid}/io") as f:
                return next((int(ln.split()[1]) for ln in f if ln.startswith("read_bytes:")), 0)
        except (OSError, ValueError):
            return 0

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.returncode is None:
            try:
                self.proc.send_signal(sig)  # by PID: the engine may re-exec itself as "exe"
            except ProcessLookupError:
                pass

    async def kill(self) -> None:
        self._signal(signal.SIGKILL)
        if self.proc:
            await self.proc.wait()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def shutdown(self, drain_timeout: float) -> None:
        """Close stdin (in-flight requests finish with DONE), then SIGTERM, 5 s, SIGKILL."""
        if self.proc is None:
            return
        assert self.proc.stdin is not None  # started with stdin=PIPE
        if not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        for sig, wait in ((None, drain_timeout), (signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, None)):
            if sig:
                self._signal(sig)
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), wait)
                break
            except asyncio.TimeoutError:
                continue
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _file_id(path: str | None) -> tuple[int, int, int] | None:
    """What tells a file's replacement: (inode, size, modification time), None when absent."""
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns) if st else None


class Supervisor:
    """Keeps one engine running. hooks: on_status(str), on_ready(engine), on_event(event),
    on_down(reason) — on_down is where in-flight requests get ENGINE_DIED — and, optional,
    on_refused(reason): the engine refused its model file (status "refused" until it changes)."""

    def __init__(self, hooks: SupervisorHooks, command: tuple[list[str], dict[str, str]] | None = None,
                 ready_timeout: float | None = None) -> None:
        self.hooks = hooks
        self.command = command or engine_command()
        self.ready_timeout = ready_timeout or settings.ENGINE_READY_TIMEOUT
        self.engine: Engine | None = None
        self.restarts = 0
        self.stopping = False
        self.status = "starting"
        self.next_attempt = time.monotonic()
        self.last_start_s = 1.0  # how long the last start took (READY or failure)
        self.refusal: str | None = None  # while status is "refused": the engine's reason

    def retry_after(self) -> int:
        """Whole seconds until an engine may be up again (for Retry-After), at least 1."""
        wait = max(0.0, self.next_attempt - time.monotonic()) + self.last_start_s
        return max(1, int(wait + 0.999))

    def _status(self, status: str) -> None:
        self.status = status
        self.hooks.on_status(status)

    async def run(self) -> None:
        delay = BACKOFF_FIRST
        first = True
        while not self.stopping:
            if not first:
                self.restarts += 1
            first = False
            self._status("starting")
            argv, env = self.command
            engine = Engine(argv, env, on_event=self.hooks.on_event, slots=settings.KV_SLOTS,
                            read_pause=getattr(self.hooks, "read_pause", None))
            started = time.monotonic()
            try:
                await engine.start(self.ready_timeout)
            except (EngineFailed, OSError) as exc:
                log.error("engine failed to start: %s", exc)
                reason, ready = str(exc), False
                refusal = exc.refusal if isinstance(exc, EngineFailed) else None
            else:
                ready = True
                self.refusal = None
                self.last_start_s = time.monotonic() - started
                delay = BACKOFF_FIRST  # it started: the next crash is retried quickly again
                self.engine = engine
                self._status("up")
                self.hooks.on_ready(engine)
                reason = await asyncio.shield(engine.exited)
                self.engine = None
            if self.stopping:
                return
            log.error("engine down: %s", reason)
            self.next_attempt = time.monotonic() + delay
            self._status("down")
            self.hooks.on_down(reason)
            if not ready:
                self.last_start_s = time.monotonic() - started
                on_start_failed = getattr(self.hooks, "on_start_failed", None)
                if on_start_failed:
                    on_start_failed(reason)
                if refusal:
                    await self._refused(refusal)
                    delay = BACKOFF_FIRST
                    continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    async def _refused(self, refusal: str) -> None:
        """Reports the engine's refusal of its model file, then waits until that file changes (a
        new file may load) or REFUSED_RETRY_S have passed."""
        log.error("engine refused its model; not restarting until the file changes: %s", refusal)
        self.refusal = refusal
        self._status("refused")
        on_refused = getattr(self.hooks, "on_refused", None)
        if on_refused:
            on_refused(refusal)
        path = self.command[1].get("SNAP")
        seen = _file_id(path)
        deadline = time.monotonic() + REFUSED_RETRY_S
        # Retry-After: the next look at the file (the change may come at any time)
        self.next_attempt = time.monotonic() + (REFUSED_POLL_S if path else REFUSED_RETRY_S)
        while not self.stopping and time.monotonic() < deadline and _file_id(path) == seen:
            await asyncio.sleep(REFUSED_POLL_S)

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        self.stopping = True
        if self.engine is not None:
            await self.engine.shutdown(drain_timeout)
