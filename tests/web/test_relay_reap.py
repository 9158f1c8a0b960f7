"""chat.relay's task reaping, with a task that swallows a cancellation (a test double for
CPython 3.11's asyncio.wait_for, which does so when its inner future completes as the cancel
arrives: gh-86296)."""
import asyncio

from chat.relay import _reap


async def _swallows_first_cancel(log):
    for attempt in range(2):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            log.append(attempt)
            if attempt == 1:
                raise


async def test_it_stops_a_task_that_swallowed_one_cancellation():
    log = []
    stubborn = asyncio.create_task(_swallows_first_cancel(log))
    quick = asyncio.create_task(asyncio.sleep(3600))
    await asyncio.sleep(0)
    # a single cancel + gather (what the relay did) waits here for the hour
    await asyncio.wait_for(_reap(stubborn, quick), 5)
    assert stubborn.cancelled() and quick.cancelled()
    assert log == [0, 1]
