"""The cache backend shares one Redis pool across threads (colibri_base/cache.py): under ASGI each
request runs its sync code in a new thread, and a pool per thread meant a connect per request."""
import threading

import pytest
from django.core.cache import cache, caches


def test_threads_share_one_pool_and_the_cache_still_works():
    pools, backends = set(), []  # the backends are kept alive: a freed one's id could be reused

    def use():
        backend = caches["default"]
        backends.append(backend)
        backend.set("pool-test", "ok", 5)
        pools.add(id(backend._cache._get_connection_pool(write=True)))

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(b) for b in backends}) == 4   # Django still makes a backend per thread...
    assert len(pools) == 1      # ...but they share the process's pool
    assert cache.get("pool-test") == "ok"


async def test_async_methods_use_the_loop_and_share_values_with_the_sync_ones(monkeypatch):
    """aget/aset/aadd/aincr speak redis.asyncio (Django's defaults run the sync method in a
    thread): same keys, same serializer, so sync and async callers read each other's values."""
    from asgiref.sync import sync_to_async

    backend = caches["default"]
    await sync_to_async(backend.set)("pool-a", {"n": 1}, 5)
    monkeypatch.setattr(backend, "get", lambda *a, **k: pytest.fail("aget went through the sync get"))
    assert await backend.aget("pool-a") == {"n": 1}
    await backend.aset("pool-b", [1, 2], 5)
    assert await backend.aadd("pool-b", "other", 5) is False and await backend.aadd("pool-c", 7, 5) is True
    with pytest.raises(ValueError):
        await backend.aincr("pool-missing")
    assert await backend.aincr("pool-c", 3) == 10
    monkeypatch.undo()
    assert await sync_to_async(backend.get_many)(["pool-b", "pool-c"]) == {"pool-b": [1, 2], "pool-c": 10}
