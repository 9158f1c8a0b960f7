"""API keys resolved without the database on the hot path.

Why: under ASGI every request's sync code runs in a fresh thread, so a key lookup opened a new
PostgreSQL connection per request (3-6 ms of the first token, issue 14's profile). A web process
keeps what it resolved (the key row with its user and the user's limits) and asks Redis one
question per request instead: has any key, user or limit changed since? Every save or delete of
those rows bumps a generation counter in the shared cache (api/signals.py), so a revoked key, a
deactivated user or a new limit takes effect on the next request in every process, never later.
Invariant: an entry is used only while the generation it was read under is still current.
"""
import threading
import time

from django.core.cache import cache

from api.models import ApiKey, hash_key

GENERATION_KEY = "api:keys:generation"
MAX_ENTRIES = 4096
MAX_AGE_S = 300  # a bound for a counter lost with a Redis flush: rows are re-read at least this often

_entries = {}  # sha256(key) -> (generation, fetched monotonic, row)
_lock = threading.Lock()


def _generation():
    generation = cache.get(GENERATION_KEY)
    if generation is None:  # a fresh or flushed Redis: start a generation nobody has cached under
        cache.add(GENERATION_KEY, time.time_ns())
        generation = cache.get(GENERATION_KEY)
    return generation


def keys_changed():
    """Called after a key, user or limit row changed: every process re-reads its keys."""
    try:
        cache.incr(GENERATION_KEY)
    except ValueError:  # no counter yet: nothing can have been cached under one
        cache.add(GENERATION_KEY, time.time_ns())


def key_lookup(full_key):
    """ApiKey.lookup, answered from this process's memory while nothing changed."""
    digest = hash_key(full_key)
    generation = _generation()
    entry = _entries.get(digest)
    if entry and entry[0] == generation and time.monotonic() - entry[1] < MAX_AGE_S:
        return entry[2]
    row = ApiKey.lookup(full_key)
    if row is not None:
        with _lock:
            if len(_entries) >= MAX_ENTRIES:
                _entries.clear()
            _entries[digest] = (generation, time.monotonic(), row)
    return row
