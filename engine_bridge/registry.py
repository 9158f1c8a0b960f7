"""Which bridges run, where, serving what, how loaded, and what each slot's cache holds: every
bridge registers itself in Redis so that any web process can route a request (engine_bridge.routing).

Keys (prefix = transport.key_prefix()):
* `<prefix>:bridges` — a set of bridge ids (a bridge adds itself at each beat; a reader drops an
  id whose registration expired);
* `<prefix>:bridge:<id>:reg` — the bridge's registration, one JSON object (the fields of
  BridgeInfo, plus `held`: per slot the conversation it belongs to and its prefix chain), written
  with the heartbeat (engine_bridge.liveness.Heart) in one pipeline, with the heartbeat's TTL;
* `<prefix>:bridge:<id>:alive` — the heartbeat itself (liveness.alive_key).

Invariant: a bridge is live (listed by bridges_get) while its heartbeat is at most
liveness.STALE_S old and carries the boot its registration names; one that stops beating leaves
the rotation within STALE_S (1.5 s), its keys within liveness.TTL.

Prefix chains (why this form): the web side has the prompt's text, not its tokens, and must find
the bridge whose slot holds the longest exact prefix of it without asking any bridge. Each slot
publishes sha1 digests of its text's prefixes at fixed boundaries, every PREFIX_BLOCK_CHARS (256)
characters — `text[:256]`, `text[:512]`, … — each cut to DIGEST_CHARS hex digits and concatenated
into one string (a 16k-character slot: 64 digests, 768 characters of JSON). A router computes the
same chain for its prompt (prefix_chain) and the shared prefix is the number of leading digests
that agree (shared_blocks), exact to one block. Per-message boundaries were the other choice;
the bridge sees only rendered text, not messages, so fixed boundaries are the ones both sides can
draw alike.
"""
import hashlib
import json
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import redis
from django.conf import settings

from colibri_base.flight import shared_read
from engine_bridge import liveness, transport

PREFIX_BLOCK_CHARS = 256
DIGEST_CHARS = 12       # 48 bits of each sha1: a false match needs a collision within one slot
SNAPSHOT_REUSE_S = 0.25  # a snapshot younger than this may serve a route (served reads it just before)

# One round trip for the whole registry: every id's registration, heartbeat boot and its PTTL.
_SNAPSHOT_LUA = """
local ids = redis.call('SMEMBERS', KEYS[1])
local out = {}
for _, id in ipairs(ids) do
  local base = ARGV[1] .. ':bridge:' .. id
  local reg = redis.call('GET', base .. ':reg')
  if reg then
    table.insert(out, {id, reg, redis.call('GET', base .. ':alive') or '', redis.call('PTTL', base .. ':alive')})
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
"""


@dataclass(frozen=True)
class SlotHeld:
    """What one KV slot holds: the conversation that owns it and its text's prefix chain."""
    conversation: str | None
    chain: str


@dataclass(frozen=True)
class BridgeInfo:
    id: str            # the bridge's id (settings.BRIDGE_ID; default "main")
    host: str          # hostname it runs on
    boot: str          # its current boot id (engine_bridge.liveness)
    model: str         # the served model's id (ServedModel.id slug)
    fingerprint: str   # the model file's fingerprint (size and a digest of its ends)
    context: int       # context length
    slots: int         # KV slots
    busy: int          # slots generating now
    queued: int        # requests waiting in its queue
    beat_age_s: float  # seconds since its last heartbeat
    status: str = "up"           # its engine: up | starting | restarting | down
    queue_limit: int = 0         # its queue's bound (0: unknown)
    model_rev: str = ""          # digest of the published model facts (changes when they do)
    admitted: int = 0            # requests it has admitted since its boot (their events carry theirs)
    ended: int = 0               # requests it has ended since its boot (final events carry theirs)
    held: tuple[SlotHeld, ...] = field(default=(), compare=False, hash=False)

    @property
    def load(self) -> float:
        """Requests per slot, running or waiting: what power of two choices compares."""
        return (self.busy + self.queued) / max(self.slots, 1)

    @property
    def full(self) -> bool:
        """No slot free and its queue at its bound: a submit here would get QUEUE_FULL."""
        return self.busy >= self.slots and self.queue_limit > 0 and self.queued >= self.queue_limit


bridge_id, bridges_key = transport.bridge_id, transport.bridges_key


def registration_key(bridge: str | None = None) -> str:
    return transport.bridge_key(bridge, "reg")


# --- prefix chains --------------------------------------------------------------------------

def prefix_chain(text: str, limit_blocks: int | None = None) -> str:
    """The concatenated digests of text[:256], text[:512], … (whole blocks only; at most
    limit_blocks of them)."""
    blocks = len(text) // PREFIX_BLOCK_CHARS
    if limit_blocks is not None:
        blocks = min(blocks, limit_blocks)
    digest, parts = hashlib.sha1(), []
    for n in range(blocks):
        digest.update(text[n * PREFIX_BLOCK_CHARS:(n + 1) * PREFIX_BLOCK_CHARS].encode("utf-8", "surrogatepass"))
        parts.append(digest.copy().hexdigest()[:DIGEST_CHARS])
    return "".join(parts)


def shared_blocks(a: str, b: str) -> int:
    """How many leading blocks two prefix chains share (their texts agree on that many x 256 chars)."""
    n = 0
    for start in range(0, min(len(a), len(b)), DIGEST_CHARS):
        if a[start:start + DIGEST_CHARS] != b[start:start + DIGEST_CHARS]:
            break
        n += 1
    return n


# --- the bridge's side: what it registers ---------------------------------------------------

def model_fingerprint(path: str) -> str:
    """`<size>-<digest of its first and last MiB>` of a model file; "" for anything else (a
    model folder, an ENGINE_COMMAND engine's own files): cheap to compute at every start."""
    file = Path(path)
    if not file.is_file():
        return ""
    size, digest = file.stat().st_size, hashlib.sha1()
    with file.open("rb") as f:
        digest.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            digest.update(f.read(1 << 20))
    return f"{size}-{digest.hexdigest()[:16]}"


def host_name() -> str:
    """The host the atlas/ops pages and /health name (env BRIDGE_HOST, else the hostname)."""
    return str(getattr(settings, "BRIDGE_HOST", "") or socket.gethostname())


def model_rev(info: dict | None) -> str:
    return hashlib.sha1(json.dumps(info or {}, sort_keys=True).encode()).hexdigest()[:12] if info else ""


class SlotChains:
    """The bridge's prefix chain per slot text, computed once per text (texts change at release)."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[str, str]] = {}  # slot -> (text, chain)

    def chain(self, slot: int, text: str) -> str:
        known = self.cache.get(slot)
        if known is None or known[0] is not text:
            known = self.cache[slot] = (text, prefix_chain(text))
        return known[1]


def registration_dict(info: BridgeInfo) -> dict:
    """The JSON object a bridge writes (beat_age_s is the reader's to measure, not stored)."""
    return {"id": info.id, "host": info.host, "boot": info.boot, "model": info.model,
            "fingerprint": info.fingerprint, "context": info.context, "slots": info.slots,
            "busy": info.busy, "queued": info.queued, "status": info.status,
            "queue_limit": info.queue_limit, "model_rev": info.model_rev,
            "admitted": info.admitted, "ended": info.ended,
            "held": [[h.conversation, h.chain] for h in info.held]}


# --- the readers' side ----------------------------------------------------------------------

def _info_from(bridge: str, raw: bytes, boot: bytes, pttl: int) -> BridgeInfo | None:
    """A live bridge's info from its snapshot row, or None (stale beat, other boot, bad JSON)."""
    try:
        reg = json.loads(raw)
        held = tuple(SlotHeld(c if isinstance(c, str) else None, str(chain)) for c, chain in reg.get("held") or ())
        age = 0.0 if pttl < 0 else max(0.0, liveness.TTL - pttl / 1000)
        info = BridgeInfo(
            id=bridge, host=str(reg.get("host", "")), boot=str(reg.get("boot", "")), model=str(reg.get("model", "")),
            fingerprint=str(reg.get("fingerprint", "")), context=int(reg.get("context") or 0),
            slots=int(reg.get("slots") or 0), busy=int(reg.get("busy") or 0), queued=int(reg.get("queued") or 0),
            beat_age_s=age, status=str(reg.get("status") or "down"), queue_limit=int(reg.get("queue_limit") or 0),
            model_rev=str(reg.get("model_rev") or ""), admitted=int(reg.get("admitted") or 0),
            ended=int(reg.get("ended") or 0), held=held)
    except (ValueError, TypeError, AttributeError):
        return None
    alive = bool(boot) and boot.decode() == info.boot and pttl != -2 and age <= liveness.STALE_S
    return info if alive else None


def _decode_rows(rows: list) -> list[BridgeInfo]:
    infos = [_info_from(row[0].decode(), row[1], row[2], int(row[3])) for row in rows or ()]
    return sorted((info for info in infos if info is not None), key=lambda info: info.id)


_snapshot: dict[str, Any] = {"at": float("-inf"), "bridges": []}


def _remember(bridges: list[BridgeInfo]) -> list[BridgeInfo]:
    _snapshot.update(at=time.monotonic(), bridges=bridges)
    return bridges


def bridges_get() -> list[BridgeInfo]:
    """The live bridges (fresh heartbeat), sorted by id; raises redis errors (callers decide)."""
    client = transport.process_client("registry", socket_timeout=2)
    # redis-py annotates eval as `Awaitable | str` (engine_bridge.transport says more)
    rows = cast(list, client.eval(_SNAPSHOT_LUA, 1, bridges_key(), transport.key_prefix()))
    return _remember(_decode_rows(rows))


async def abridges_get(max_age_s: float = 0.0) -> list[BridgeInfo]:
    """bridges_get on the event loop, in one round trip (shared with the identical read in
    flight, colibri_base.flight); with max_age_s, a snapshot this process
    read at most that long ago may answer instead (a route right after the served-model read),
    its beat ages grown by its own age so that they still date each beat right."""
    age = time.monotonic() - float(_snapshot["at"])
    if max_age_s > 0 and age <= max_age_s:
        return [replace(b, beat_age_s=b.beat_age_s + age) for b in _snapshot["bridges"]]
    return list(await shared_read(("registry", bridges_key()), _aread_bridges))


async def _aread_bridges() -> list[BridgeInfo]:
    """One snapshot read (the requests of a burst share it: colibri_base.flight)."""
    client = transport.loop_client("registry", socket_timeout=2)
    # redis-py annotates asyncio commands as `Awaitable[T] | T` (engine_bridge.transport says more)
    rows: list = await client.eval(_SNAPSHOT_LUA, 1, bridges_key(), transport.key_prefix())  # type: ignore[misc]
    return _remember(_decode_rows(rows))


def default_model(bridges: list[BridgeInfo]) -> str | None:
    """settings.DEFAULT_MODEL when a live bridge serves it, else the first model by bridge id."""
    wanted = str(getattr(settings, "DEFAULT_MODEL", "") or "")
    models = [b.model for b in bridges]
    if wanted and wanted in models:
        return wanted
    return models[0] if models else None


def default_bridge(bridges: list[BridgeInfo]) -> str:
    """The bridge a reader means by "the default": the first live one serving the default model
    (an engine that is up first), else this process's own id (settings.BRIDGE_ID)."""
    model = default_model(bridges)
    serving = sorted((b for b in bridges if b.model == model), key=lambda b: (b.status != "up", b.id))
    return serving[0].id if serving else bridge_id()


def safe_bridges_get() -> list[BridgeInfo]:
    """bridges_get, or [] when Redis does not answer (a reader then falls back to the default id)."""
    try:
        return bridges_get()
    except (redis.RedisError, OSError):
        return []


async def asafe_bridges_get(max_age_s: float = 0.0) -> list[BridgeInfo]:
    try:
        return await abridges_get(max_age_s)
    except (redis.RedisError, OSError):
        return []
