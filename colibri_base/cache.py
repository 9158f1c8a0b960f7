"""Django's Redis cache with one connection pool per process instead of one per thread, and
async methods that run on the event loop.

Why: Django keeps a cache backend per thread, and under ASGI each request's sync code runs in a
thread of its own, so every request built a new redis-py pool and opened a new connection for
its first cache call (throttles, the key cache): a connect on each API request's first token
(issue 14's profile). redis-py's pools are thread-safe, so the process shares one client per
server list and options; nothing else about the backend changes.

Django's own async cache methods (aget, aset, ...) are the sync ones run in a thread: two thread
hops per call. Here aget/aset/aadd/aincr speak redis.asyncio on the running loop instead, with
the same keys and the same serializer as the sync methods, so both sides read each other's values.
`async_client(cache)` lends that client to callers with their own commands (the limits' scripts).
"""
import asyncio
import threading
import weakref
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django.core.cache.backends.redis import RedisCache
from redis import asyncio as redis_asyncio

_clients: dict[tuple, Any] = {}  # (servers, options) -> the process's redis-py client
_lock = threading.Lock()
_loop_clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> {server: redis.asyncio.Redis}


class SharedPoolRedisCache(RedisCache):
    # Set by RedisCache.__init__; django-stubs does not declare them.
    _servers: list[str]
    _options: dict[str, Any]
    _class: type

    @property
    def _cache(self) -> Any:
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        client = _clients.get(key)
        if client is None:
            with _lock:
                client = _clients.setdefault(key, self._class(self._servers, **self._options))
        return client

    def aclient(self) -> redis_asyncio.Redis:
        """This loop's asyncio client of the write server (the first in LOCATION). A client's
        pool belongs to the loop that made it, hence one per loop."""
        per_loop = _loop_clients.setdefault(asyncio.get_running_loop(), {})
        server = self._servers[0]
        if server not in per_loop:
            per_loop[server] = redis_asyncio.Redis.from_url(server, socket_connect_timeout=2)
        return per_loop[server]

    async def aget(self, key: str, default: Any = None, version: int | None = None) -> Any:
        value = await self.aclient().get(self.make_and_validate_key(key, version=version))
        return default if value is None else self._cache._serializer.loads(value)

    async def aset(self, key: str, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        if timeout == 0:
            await self.aclient().delete(key)
        else:
            await self.aclient().set(key, self._cache._serializer.dumps(value), ex=timeout)

    async def aadd(self, key: str, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        timeout = self.get_backend_timeout(timeout)
        client, value = self.aclient(), self._cache._serializer.dumps(value)
        if timeout == 0:  # as the sync add: true when the key was free, which it is again after
            added = bool(await client.set(key, value, nx=True))
            if added:
                await client.delete(key)
            return added
        return bool(await client.set(key, value, ex=timeout, nx=True))

    async def aincr(self, key: str, delta: int = 1, version: int | None = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        client = self.aclient()
        if not await client.exists(key):
            raise ValueError(f"Key '{key}' not found.")
        return await client.incr(key, delta)


def async_client(cache: BaseCache) -> redis_asyncio.Redis | None:
    """The asyncio Redis client of `cache` on this loop, or None for a backend that has none."""
    aclient = getattr(cache, "aclient", None)
    return aclient() if aclient is not None else None
