"""KV slot ownership and the wait queue. Pure logic: no I/O, no clock, unit-testable.

Policy (why: the engine reuses a slot's KV prefix, so the right slot saves a whole prefill):
* a job with a conversation_key goes to the slot that key owns; if that slot is busy the job
  waits for it (jobs behind it may still start elsewhere);
* otherwise: an idle unowned slot whose last prompt+output shares a substantial prefix with the
  new prompt (stateless API turns), else a never-used slot, else the least recently used idle
  slot (its owner is evicted);
* a busy slot is never handed out; waiting jobs are served interactive first, then FIFO.
"""
from dataclasses import dataclass, field

PRIORITIES = {"interactive": 0, "background": 1}
MIN_PREFIX_CHARS = 64


class QueueFull(Exception):
    pass


@dataclass
class Slot:
    index: int
    busy: str | None = None  # the req of the job running on it
    key: str | None = None   # the conversation that owns it
    text: str = ""           # last prompt + output (approximates the engine's KV contents)
    used: int = 0            # logical clock of the last release (0 = never used)


@dataclass
class Job:
    req: str
    prompt: str
    key: str | None = None
    priority: str = "interactive"
    order: int = field(default=0, compare=False)


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    def __init__(self, slots: int, queue_limit: int) -> None:
        self.slots = [Slot(i) for i in range(slots)]
        self.queue_limit = queue_limit
        self.queue: list[Job] = []
        self.clock = 0
        self.arrivals = 0
        self.paused = False  # True while the engine is down: jobs wait, nothing starts

    def submit(self, job: Job) -> list[tuple[Job, int]]:
        """Queue the job and dispatch. Returns [(job, slot index)] to start now; QueueFull if the
        job would have to wait and the queue is already full."""
        self.arrivals += 1
        job.order = self.arrivals
        self.queue.append(job)
        self.queue.sort(key=lambda j: (PRIORITIES.get(j.priority, 0), j.order))
        started = self.dispatch()
        if job in self.queue and len(self.queue) > self.queue_limit:
            self.queue.remove(job)
            raise QueueFull()
        return started

    def dispatch(self) -> list[tuple[Job, int]]:
        started: list[tuple[Job, int]] = []
        if self.paused:
            return started
        for job in list(self.queue):
            slot = self.pick(job)
            if slot is None:
                continue
            self.queue.remove(job)
            slot.busy = job.req
            slot.key = job.key
            started.append((job, slot.index))
        return started

    def pick(self, job: Job) -> Slot | None:
        if job.key is not None:
            owned = [s for s in self.slots if s.key == job.key]
            if owned:
                return None if owned[0].busy is not None else owned[0]
        idle = [s for s in self.slots if s.busy is None]
        if not idle:
            return None
        best: Slot | None = None
        best_len = 0
        for slot in idle:
            if slot.key is None and slot.text:
                n = common_prefix(slot.text, job.prompt)
                if n > best_len:
                    best, best_len = slot, n
        if best is not None and best_len >= MIN_PREFIX_CHARS:
            return best
        fresh = [s for s in idle if s.used == 0 and s.key is None]
        if fresh:
            return fresh[0]
        return min(idle, key=lambda s: s.used)

    def release(self, req: str, text: str = "") -> list[tuple[Job, int]]:
        """The job `req` finished (DONE, CANCELLED or engine death). Returns newly started jobs."""
        for slot in self.slots:
            if slot.busy == req:
                self.clock += 1
                slot.busy, slot.text, slot.used = None, text, self.clock
        return self.dispatch()

    def remove(self, req: str) -> bool:
        """Drop a waiting job (cancelled before it started). True if it was waiting."""
        for job in self.queue:
            if job.req == req:
                self.queue.remove(job)
                return True
        return False

    def positions(self) -> dict[str, int]:
        """{req: position} of waiting jobs, 1 = next."""
        return {job.req: i + 1 for i, job in enumerate(self.queue)}

    def slot_of(self, req: str) -> int | None:
        for slot in self.slots:
            if slot.busy == req:
                return slot.index
        return None

    def reset(self) -> None:
        """The engine restarted: its KV is gone, nothing runs. Waiting jobs stay queued."""
        self.slots = [Slot(i) for i in range(len(self.slots))]

    def snapshot(self) -> list[dict[str, object]]:
        return [{"slot": s.index, "busy": s.busy is not None, "key": s.key} for s in self.slots]
