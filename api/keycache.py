"""API keys resolved without the database on the hot path.

Why: under ASGI every request's sync code runs in a fresh thread, so a key lookup opened a new
PostgreSQL connection per request (3-6 ms of the first token, issue 14's profile). A web process
keeps what it resolved (the key row with its user and the user's limits) and asks Redis one
question per request instead: has any key, user or limit changed since? Every save or delete of
those rows bumps a generation counter in the shared cache (api/keygen.py, from api/signals.py), so a revoked key, a
deactivated user or a new limit takes effect on the next request in every process.
A change that sends no signal (a queryset update() from an admin action or a script, a raw SQL
write) cannot bump it, so an entry is also re-read from the database once it is MAX_AGE_S old:
such a change takes effect within a second (issue 24; it was 300 s). That costs one database read
per key and process per second at most, against the one per request that issue 14 removed.
`akey_lookup` asks that question on the event loop (the generation routes authenticate there);
only a miss reads the database, in a thread.
Invariant: an entry is used only while the generation it was read under is still current and it
is younger than MAX_AGE_S.
"""
import threading
import time

from api.keygen import ageneration, generation
from api.models import ApiKey, hash_key
from colibri_base.flight import shared_read
from colibri_base.lean import database_call

MAX_ENTRIES = 4096
MAX_AGE_S = 1.0  # rows are re-read at least this often: the bound for changes no signal reports

Entry = tuple[int, float, ApiKey]  # (generation, fetched monotonic, row)
_entries: dict[str, Entry] = {}  # sha256(key) -> its entry
_lock = threading.Lock()


def _cached(digest: str, generation: int) -> Entry | None:
    entry = _entries.get(digest)
    if entry and entry[0] == generation and time.monotonic() - entry[1] < MAX_AGE_S:
        return entry
    return None


def _remember(digest: str, generation: int, row: ApiKey | None) -> ApiKey | None:
    if row is not None:
        with _lock:
            if len(_entries) >= MAX_ENTRIES:
                _entries.clear()
            _entries[digest] = (generation, time.monotonic(), row)
    return row


def key_lookup(full_key: str) -> ApiKey | None:
    """ApiKey.lookup, answered from this process's memory while nothing changed."""
    digest, current = hash_key(full_key), generation()
    entry = _cached(digest, current)
    return entry[2] if entry else _remember(digest, current, ApiKey.lookup(full_key))


async def akey_lookup(full_key: str) -> ApiKey | None:
    """key_lookup for the event loop: the generation from Redis without a thread; a miss reads the
    database in one (colibri_base.lean.database_call), one read for all the misses of one key
    that arrive while it runs (colibri_base.flight). Clients send bursts (8 requests of one key at
    once), and each expiry of the entry made all of them read the row, each in a thread of its
    own with a new PostgreSQL connection: ~40 % of a burst benchmark's requests, 13 % of Daphne's
    CPU (py-spy)."""
    digest, current = hash_key(full_key), await ageneration()
    entry = _cached(digest, current)
    if entry:
        return entry[2]
    row = await shared_read(("api-key-row", digest, current), lambda: database_call(ApiKey.lookup)(full_key))
    return _remember(digest, current, row)
