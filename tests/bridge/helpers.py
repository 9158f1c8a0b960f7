import asyncio
import contextlib

from engine_bridge.client import generate

CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


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
