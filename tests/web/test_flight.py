"""colibri_base.flight.shared_read: the identical reads of a burst share one round trip; a caller
joins only a read already on its way, and a finished read never answers again (no answer older
than the read it joined)."""
import asyncio

import pytest

from colibri_base.flight import shared_read


class Reads:
    """A read that counts its calls and answers when told (the test plays Redis)."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self) -> int:
        self.calls += 1
        answer = self.calls
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return answer


@pytest.mark.asyncio
async def test_callers_that_ask_while_a_read_runs_share_it_and_a_later_call_reads_anew() -> None:
    read = Reads()
    burst = [asyncio.create_task(shared_read("k", read)) for _ in range(8)]
    await asyncio.sleep(0)
    read.gate.set()
    assert await asyncio.gather(*burst) == [1] * 8 and read.calls == 1
    assert await shared_read("k", read) == 2 and read.calls == 2      # finished reads are not reused
    assert await shared_read("other", read) == 3                       # another key is another read


@pytest.mark.asyncio
async def test_a_caller_that_leaves_does_not_cancel_the_read_of_the_others() -> None:
    read = Reads()
    leaving = asyncio.create_task(shared_read("k", read))
    staying = asyncio.create_task(shared_read("k", read))
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.sleep(0)
    read.gate.set()
    assert await staying == 1 and read.calls == 1
    assert leaving.cancelled()


@pytest.mark.asyncio
async def test_a_failed_read_fails_every_caller_and_the_next_call_reads_again() -> None:
    read = Reads()
    read.fail = ConnectionError("redis is down")
    burst = [asyncio.create_task(shared_read("k", read)) for _ in range(3)]
    await asyncio.sleep(0)
    read.gate.set()
    results = await asyncio.gather(*burst, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results) and read.calls == 1
    read.fail = None
    assert await shared_read("k", read) == 2
