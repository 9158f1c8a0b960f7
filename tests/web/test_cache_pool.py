"""The cache backend shares one Redis pool across threads (colibri_site/cache.py): under ASGI each
request runs its sync code in a new thread, and a pool per thread meant a connect per request."""
import threading

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
