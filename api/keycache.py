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
While Redis does not answer (api.outage.BROKER_ERRORS), the key is still known: the database is
the authority and the generation only says when to ask it sooner. An entry younger than MAX_AGE_S
is used whatever its generation; an older one, or none, is read from the database and kept under
OUTAGE, a generation Redis never holds, so the first request after the outage reads the row again.
A 500 for every new request of a short outage (the generation's connection error) was the
alternative. Revocation keeps its bound: a row is never used more than MAX_AGE_S after it was
read, so a revocation committed to the database refuses the key within MAX_AGE_S in every
process, whether its signal reached Redis, arrived late or failed (api.keygen.keys_changed).
Invariant: an entry is used only while it is younger than MAX_AGE_S and either the generation it
was read under is still current or Redis cannot say.
"""
import asyncio
import logging
import threading
import time

from api import outage
from api.keygen import ageneration, generation
from api.models import ApiKey, hash_key
from colibri_base.flight import shared_read
from colibri_base.lean import database_call

log = logging.getLogger(__name__)

MAX_ENTRIES = 4096
MAX_AGE_S = 1.0  # rows are re-read at least this often: the bound for changes no signal reports

OUTAGE = None  # the generation of an entry read while Redis did not answer: never current
Entry = tuple[int | None, float, ApiKey]  # (generation, fetched monotonic, row)
_entries: dict[str, Entry] = {}  # sha256(key) -> its entry
_lock = threading.Lock()


def _cached(digest: str, generation: int | None) -> Entry | None:
    """The entry, if young and read under `generation` (OUTAGE: Redis cannot say, any will do)."""
    entry = _entries.get(digest)
    if entry and (generation is OUTAGE or entry[0] == generation) and time.monotonic() - entry[1] < MAX_AGE_S:
        return entry
    return None


def _remember(digest: str, generation: int | None, row: ApiKey | None) -> ApiKey | None:
    if row is not None:
        with _lock:
            if len(_entries) >= MAX_ENTRIES:
                _entries.clear()
            _entries[digest] = (generation, time.monotonic(), row)
    return row


_warned = [0.0]  # when an outage was last logged: once per WARN_EVERY_S, not once per request
WARN_EVERY_S = 10.0


def _outage(exc: BaseException) -> None:
    if time.monotonic() - _warned[0] >= WARN_EVERY_S:
        _warned[0] = time.monotonic()
        log.warning("key generation unreadable, Redis out (%s): keys are read from the database", exc)


def _generation_or_outage() -> int | None:
    try:
        return generation()
    except outage.BROKER_ERRORS as exc:
        _outage(exc)
        return OUTAGE


async def _ageneration_or_outage() -> int | None:
    try:
        async with asyncio.timeout(outage.ATTEMPT_S):  # a frozen Redis never answers
            return await ageneration()
    except outage.BROKER_ERRORS as exc:
        _outage(exc)
        outage.met()  # the request's later steps know Redis was out (api.engine waits for the bridges)
        return OUTAGE


def key_lookup(full_key: str) -> ApiKey | None:
    """ApiKey.lookup, answered from this process's memory while nothing changed."""
    digest, current = hash_key(full_key), _generation_or_outage()
    entry = _cached(digest, current)
    return entry[2] if entry else _remember(digest, current, ApiKey.lookup(full_key))


async def akey_lookup(full_key: str) -> ApiKey | None:
    """key_lookup for the event loop: the generation from Redis without a thread; a miss reads the
    database in one (colibri_base.lean.database_call), one read for all the misses of one key
    that arrive while it runs (colibri_base.flight). Clients send bursts (8 requests of one key at
    once), and each expiry of the entry made all of them read the row, each in a thread of its
    own with a new PostgreSQL connection: ~40 % of a burst benchmark's requests, 13 % of Daphne's
    CPU (py-spy)."""
    digest, current = hash_key(full_key), await _ageneration_or_outage()
    entry = _cached(digest, current)
    if entry:
        return entry[2]
    row = await shared_read(("api-key-row", digest, current), lambda: database_call(ApiKey.lookup)(full_key))
    return _remember(digest, current, row)
