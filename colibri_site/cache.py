"""Django's Redis cache with one connection pool per process instead of one per thread.

Why: Django keeps a cache backend per thread, and under ASGI each request's sync code runs in a
thread of its own, so every request built a new redis-py pool and opened a new connection for
its first cache call (throttles, the key cache): a connect on each API request's first token
(issue 14's profile). redis-py's pools are thread-safe, so the process shares one client per
server list and options; nothing else about the backend changes.
"""
import threading

from django.core.cache.backends.redis import RedisCache

_clients = {}
_lock = threading.Lock()


class SharedPoolRedisCache(RedisCache):
    @property
    def _cache(self):
        key = (tuple(self._servers), repr(sorted(self._options.items())))
        client = _clients.get(key)
        if client is None:
            with _lock:
                client = _clients.setdefault(key, self._class(self._servers, **self._options))
        return client
