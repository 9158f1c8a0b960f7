"""The key generation: one counter in the shared cache that every change of a key, user or limit
row bumps, so that every web process's key cache (api/keycache.py) knows its entries are stale.

Why its own module: the rows bump it (api.models' bulk revoke, api.signals' row signals) and the
key cache reads it, and the key cache reads the rows: with the counter inside keycache, models and
keycache imported each other. Here it sits below both and imports nothing of the app.
"""
import logging
import time

import redis
from django.core.cache import cache

from colibri_base.flight import shared_read

log = logging.getLogger(__name__)

GENERATION_KEY = "api:keys:generation"


def generation() -> int:
    """The current generation (a fresh or flushed Redis starts one nobody has cached under)."""
    value = cache.get(GENERATION_KEY)
    if value is None:
        cache.add(GENERATION_KEY, time.time_ns())
        value = cache.get(GENERATION_KEY)
    return value


async def ageneration() -> int:
    """generation() on the event loop (colibri_base.cache's async methods, no thread hop); the
    requests of a burst share one read (colibri_base.flight)."""
    value = await shared_read(GENERATION_KEY, lambda: cache.aget(GENERATION_KEY))
    if value is None:
        await cache.aadd(GENERATION_KEY, time.time_ns())
        value = await cache.aget(GENERATION_KEY)
    return value


def keys_changed() -> None:
    """Called after a key, user or limit row changed: every process re-reads its keys. With Redis
    out the change is committed all the same and only logged here: every process re-reads its
    rows within api.keycache.MAX_AGE_S anyway, so a revocation is not lost, and the admin's save
    must not fail after its commit."""
    try:
        try:
            cache.incr(GENERATION_KEY)
        except ValueError:  # no counter yet: nothing can have been cached under one
            cache.add(GENERATION_KEY, time.time_ns())
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        log.warning("a key, user or limit changed while Redis is out (%s): processes see it within a second", exc)
