"""A test double for time: an asyncio event loop whose clock moves only when the loop has nothing
ready to run, straight to its next timer.

Tests of pacing rules (a batch held for a 15 ms frame, a first token that must not wait) assert
what happens before and after a deadline. On the real clock a busy host that preempts the test
process for a frame's length moves events across that deadline, and the test fails though the
code is right. On this clock `await asyncio.sleep(0.001)` is exactly one millisecond of the code's
time, however slow the host: the outcome depends only on the code.

The clock is the loop's (`loop.time()`, which `call_at` timers use); code that reads
`time.monotonic()` itself is pointed at it with `patch_monotonic`.
"""
import asyncio
import functools
import selectors
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

T = TypeVar("T")


class _Selector(selectors.DefaultSelector):
    """Polls real file descriptors without waiting; a wait for a timer advances the clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualClockLoop | None = None

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if not ready and timeout and self.loop is not None:
            self.loop.now += timeout
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        self.now = 1000.0
        selector.loop = self

    def time(self) -> float:
        return self.now


def run(coro: Awaitable[T]) -> T:
    """Runs `coro` to completion on a fresh virtual-clock loop."""
    loop = VirtualClockLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def patch_monotonic(monkeypatch: Any, module: Any) -> None:
    """Points `module.time.monotonic` at the running virtual loop's clock (the rest of `time` is kept)."""
    clock = SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    clock.monotonic = lambda: asyncio.get_running_loop().time()
    monkeypatch.setattr(module, "time", clock)


def on_virtual_clock(test: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Decorates an async test to run on a virtual-clock loop (its fixtures are resolved as usual)."""
    @functools.wraps(test)
    def sync_test(*args: Any, **kwargs: Any) -> T:
        return run(test(*args, **kwargs))
    return sync_test
