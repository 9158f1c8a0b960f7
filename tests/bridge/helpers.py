import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from engine_bridge import registry, served
from engine_bridge.client import generate
from engine_bridge.request import GenerationRequest
from tests.support import procs

CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
LONG = 100_000  # tokens: outlasts each step (the fixture model decodes thousands a second)


async def collect(request, timeout=60, **kwargs):
    """All events of one generation (the synthetic `submitted` first)."""
    async def run():
        async with contextlib.aclosing(generate(request, **kwargs)) as events:
            return [event async for event in events]
    return await asyncio.wait_for(run(), timeout)


def text_of(events):
    return "".join(e["text"] for e in events if e["kind"] == "text")


def final(events):
    assert events[-1]["kind"] in ("done", "error"), events[-1]
    return events[-1]


# --- several bridges (tests/bridge/test_several_bridges.py, test_netns_hosts.py) ------------

def fixture_model(model_dir: Path, name: str, seed: int, *extra: str) -> Path:
    """A tiny fixture model named `name` (its stem is the id its bridges serve), made once."""
    path = model_dir / f"{name}.gguf"
    return path if path.exists() else procs.make_tiny_model(path, "--seed", str(seed), *extra)


def turn(model: str, prompt: str, key: str | None = None, max_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(prompt=prompt, max_tokens=max_tokens, model=model, conversation_key=key)


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def routed_to(events: list) -> str:
    """The bridge the router chose (the stream's `routed` event)."""
    return next(e["bridge"] for e in events if e is not None and e["kind"] == "routed")


async def first_text(agen: AsyncIterator) -> list:
    """The events up to the first text (the stream goes on)."""
    seen = []
    async for event in agen:
        seen.append(event)
        if event is not None and event["kind"] == "text":
            return seen
    raise AssertionError(f"the stream ended before any text: {seen}")


async def count_texts(agen: AsyncIterator, wanted: int) -> int:
    """Reads a stream until `wanted` more text events came (or it ended): how many did."""
    seen = 0
    async for event in agen:
        if event is not None and event["kind"] in ("done", "error"):
            break
        seen += event is not None and event["kind"] == "text"
        if seen == wanted:
            break
    return seen


async def serving(model: str) -> tuple[str, ...]:
    m = await served.aserved_model_get(model)
    return m.bridges if m is not None else ()


async def registered(ids: tuple[str, ...]) -> bool:
    live = {i.id for i in await registry.abridges_get()}
    return set(ids) <= live


async def is_up(bridge: str) -> bool:
    return any(i.id == bridge and i.status == "up" for i in await registry.abridges_get())


async def is_gone(bridge: str) -> bool:
    return bridge not in {i.id for i in await registry.abridges_get()}


async def is_busy(bridge: str) -> bool:
    return any(i.id == bridge and i.busy for i in await registry.abridges_get())


class Stream:
    """One generation read in the background; the test waits for the events it needs (a queued
    position, the first text) instead of sleeping and hoping the bridge got there."""

    def __init__(self, request: GenerationRequest, **kwargs) -> None:
        self.events: list = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._read(request, kwargs))

    async def _read(self, request: GenerationRequest, kwargs: dict) -> list:
        try:
            async with contextlib.aclosing(generate(request, **kwargs)) as events:
                async for event in events:
                    self.events.append(event)
                    self._changed.set()
            return self.events
        finally:
            self._changed.set()

    async def seen(self, kind: str, timeout: float = 30) -> dict:
        """The first event of `kind`, once it has come."""
        deadline = time.monotonic() + timeout
        while True:
            hit = next((e for e in self.events if e is not None and e["kind"] == kind), None)
            if hit is not None:
                return hit
            assert not self.task.done(), f"the stream ended without a {kind!r} event: {self.events}"
            self._changed.clear()
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind!r} event within {timeout} s: {self.events}"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def result(self, timeout: float = 60) -> list:
        return await asyncio.wait_for(self.task, timeout)
