"""Per-key and per-user admission limits for the /v1 generation routes: requests per minute (a
sliding log per account) and tokens per minute (a token bucket), both in the default cache's
Redis, shared by every web process, each checked by one atomic script.

Limits come from the ApiKey row, the user's UserApiLimit row (both set by staff in the admin),
then settings.API_DEFAULT_REQUESTS_PER_MINUTE / API_DEFAULT_TOKENS_PER_MINUTE; none = unlimited.

Tokens: each limited account (key, user) has a bucket of `limit` tokens that refills at limit/60
per second (a sliding minute, not a calendar one). A request is admitted only when every bucket
holds its charge — the rendered prompt's estimate (UTF-8 bytes / 4) plus the output budget it
may use (max_tokens, else the served context) — and the charge is taken at admission, so
concurrent requests cannot all pass on one minute's allowance. A charge above the limit is capped
at the limit (such a request waits for a full bucket instead of never passing). When the
generation ends the charge is settled against what it used (prompt + completion from the engine;
a cancelled stream: its prompt and an estimate of the text it got; refused before the engine took
it: nothing): unused tokens return, an overrun is owed (the bucket goes below zero and the next
requests wait it out). One atomic Lua script per admission and per settlement.
A refusal is 429 in the surface's envelope with Retry-After (the seconds until the buckets hold
the charge) and the rate-limit headers of the surface's family (api/views.py).
While Redis is out an admission waits for it (api.outage.ride_out: the request's ride-out window,
then 503 + Retry-After); a settlement that finds it out is dropped (logged): the charge stands
and the bucket refills within WINDOW_S.
"""
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from api import outage
from api.models import ApiKey, UserApiLimit
from colibri_base.cache import async_client

log = logging.getLogger(__name__)

WINDOW_S = 60
Account = tuple[str, str, int]  # (scope: key | user, ident, limit per minute)
RateInfo = tuple[int, int, float]  # (limit, remaining, seconds until full)


def _user_limits(user: User) -> UserApiLimit | None:
    try:
        return user.api_limit
    except Exception:  # no row (RelatedObjectDoesNotExist) or an anonymous user
        return None


def limit_for(request: Request, field: str) -> list[Account]:
    """[(scope, ident, limit per minute)] for the key, then the user; only the limited ones."""
    default = getattr(settings, f"API_DEFAULT_{field.upper()}", None)
    # Permissions run before throttles (IsAuthenticated): a user is signed in, by an API key or a session.
    key, user = cast(ApiKey | None, request.auth), cast(User, request.user)
    if not hasattr(request, "_api_user_limits"):  # one query per request, not one per throttle
        setattr(request, "_api_user_limits", _user_limits(user))
    user_row = getattr(request, "_api_user_limits")
    out: list[Account] = []
    if key is not None and getattr(key, field, None):
        out.append(("key", key.prefix, getattr(key, field)))
    user_limit = (getattr(user_row, field, None) if user_row else None) or default
    if user_limit:
        out.append(("user", f"{user.pk}-{int(user.date_joined.timestamp())}", user_limit))
    return out


class _PerMinute(BaseThrottle):
    """A sliding log of the account's requests in the last minute (a Redis sorted set, read and
    written by one atomic script, on the event loop). Records the tightest request limit on the
    request (`_api_ratelimit["requests"]`) for the headers."""

    scope_name: str | None = None

    def __init__(self) -> None:
        self.wait_s: float | None = None

    # A coroutine where DRF's is sync: api.loopview awaits it (the only views that use these).
    async def allow_request(self, request: Request, view: APIView) -> bool:  # type: ignore[override]
        for scope, ident, limit in limit_for(request, "requests_per_minute"):
            if scope != self.scope_name:
                continue
            key = cache.make_key(f"api_rpm:{scope}:{ident}")

            async def log_request() -> tuple[float, Any]:  # its time is the try's (a ride-out may wait)
                now = time.time()
                return now, await _ascript(_LOG_LUA, [key], [repr(now), str(WINDOW_S), str(int(limit)),
                                                             f"{now!r}-{uuid.uuid4().hex[:12]}"])
            now, out = await outage.ride_out(log_request)
            admitted, count, oldest = bool(int(out[0])), int(out[1]), float(out[2])
            reset = max(0.0, WINDOW_S - (now - oldest))
            info = getattr(request, "_api_ratelimit", None)
            if info is None:
                info = {}
                setattr(request, "_api_ratelimit", info)
            remaining = max(0, limit - count)
            if "requests" not in info or remaining < info["requests"][1]:
                info["requests"] = (limit, remaining, reset)
            self.wait_s = None if admitted else reset
            return admitted
        return True

    def wait(self) -> float | None:
        return self.wait_s


class KeyRequestThrottle(_PerMinute):
    scope_name = "key"


class UserRequestThrottle(_PerMinute):
    scope_name = "user"


# KEYS: one bucket per account; ARGV: now, mode (admit | settle), then per bucket: limit, amount.
# admit: refuse (0, seconds to wait) unless every bucket holds min(amount, limit); else take it.
# settle: take `amount` (negative = a refund), never above the limit. Returns the levels after.
# Numbers go back as strings (Redis would truncate Lua numbers to integers).
_BUCKET_LUA = """
local now, mode, n = tonumber(ARGV[1]), ARGV[2], #KEYS
local levels, wait = {}, 0
for i = 1, n do
  local limit, amount = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local rate = limit / 60
  local v = redis.call('HMGET', KEYS[i], 'level', 'ts')
  local level, ts = tonumber(v[1]), tonumber(v[2])
  if level == nil then level, ts = limit, now end
  level = math.min(limit, level + math.max(0, now - ts) * rate)
  levels[i] = level
  if mode == 'admit' and level < math.min(amount, limit) then
    wait = math.max(wait, (math.min(amount, limit) - level) / rate)
  end
end
local out = {1, '0'}
if wait > 0 then out = {0, tostring(wait)} end
for i = 1, n do
  local limit, amount = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  local level = levels[i]
  if wait == 0 then
    if mode == 'admit' then amount = math.min(amount, limit) end
    level = math.min(limit, level - amount)
    redis.call('HSET', KEYS[i], 'level', tostring(level), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], math.ceil((limit - level) / (limit / 60)) + 60)
  end
  out[2 + i] = tostring(level)
end
return out
"""
# KEYS[1]: an account's request log (a sorted set of request times); ARGV: now, window, limit, a
# unique member. Drops what left the window; admits (and logs) the request while fewer than
# `limit` remain. Returns {admitted, requests in the window, the oldest one's time}.
_LOG_LUA = """
local now, window, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local n, admitted = redis.call('ZCARD', KEYS[1]), 0
if n < limit then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('EXPIRE', KEYS[1], math.ceil(window))
  n, admitted = n + 1, 1
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ARGV[1]
return {admitted, n, oldest}
"""


def _script(lua: str, keys: list[str], args: list[str]) -> Any:
    """Runs a script on the default cache's Redis (EVALSHA, loading it once per server)."""
    client = cast(RedisCache, cache)._cache.get_client(None, write=True)  # SharedPoolRedisCache / RedisCache
    return client.register_script(lua)(keys=keys, args=args, client=client)


async def _ascript(lua: str, keys: list[str], args: list[str]) -> Any:
    """_script on the event loop; in a thread for a cache backend without an asyncio client."""
    client = async_client(cache)
    if client is None:
        return await sync_to_async(_script, thread_sensitive=False)(lua, keys, args)
    return await client.register_script(lua)(keys=keys, args=args)


def _bucket_call(mode: str, accounts: Sequence[Account], amounts: Iterable[float],
                 now: float | None) -> tuple[list[str], list[str]]:
    keys = [cache.make_key(f"api_tpm:{scope}:{ident}") for scope, ident, _ in accounts]
    args = [repr(time.time() if now is None else float(now)), mode]
    for (_, _, limit), amount in zip(accounts, amounts):
        args += [str(int(limit)), repr(float(amount))]
    return keys, args


def _bucket_result(out: list[Any]) -> tuple[bool, float, list[float]]:
    """-> (admitted, wait_s, levels)."""
    return bool(int(out[0])), float(out[1]), [float(x) for x in out[2:]]


def _bucket(mode: str, accounts: Sequence[Account], amounts: Iterable[float],
            now: float | None = None) -> tuple[bool, float, list[float]]:
    """accounts: [(scope, ident, limit)]; amounts: one per account."""
    return _bucket_result(_script(_BUCKET_LUA, *_bucket_call(mode, accounts, amounts, now)))


async def _abucket(mode: str, accounts: Sequence[Account], amounts: Iterable[float],
                  now: float | None = None) -> tuple[bool, float, list[float]]:
    return _bucket_result(await _ascript(_BUCKET_LUA, *_bucket_call(mode, accounts, amounts, now)))


def estimate_tokens(text: str) -> int:
    """A text's token count before the engine says: ~4 bytes of UTF-8 per token, rounded up."""
    return -(-len(text.encode("utf-8", "replace")) // 4)


def _refill_s(limit: float, level: float) -> float:
    return max(0.0, (limit - level) / (limit / WINDOW_S))


class Reservation:
    """The tokens a request was charged at admission, settled once against what it used."""

    def __init__(self, accounts: Iterable[Account] = (), charges: Iterable[float] = (),
                 levels: Iterable[float] = ()) -> None:
        self.accounts, self.charges, self.levels = list(accounts), list(charges), list(levels)
        self.settled = False

    def settle(self, used: float, now: float | None = None) -> None:
        if self.settled or not self.accounts:
            return
        self.settled = True
        try:
            _bucket("settle", self.accounts, [used - c for c in self.charges], now=now)
        except outage.BROKER_ERRORS as exc:  # the charge stands; the buckets refill within WINDOW_S
            log.warning("settling a token reservation failed, Redis out (%s): its charge stands", exc)

    def info(self) -> RateInfo | None:
        """(limit, remaining, seconds until full) of the tightest bucket after admission, or None."""
        if not self.accounts:
            return None
        i = min(range(len(self.accounts)), key=lambda k: self.levels[k])
        limit = self.accounts[i][2]
        return limit, max(0, int(self.levels[i])), _refill_s(limit, self.levels[i])


class TokenLimitExceeded(Exception):
    def __init__(self, wait: float, info: RateInfo) -> None:
        super().__init__(f"token limit: retry in {wait:.1f} s")
        self.wait, self.info = wait, info  # info: (limit, remaining, seconds until full)


def tokens_admit(accounts: Sequence[Account], amount: int, now: float | None = None) -> Reservation:
    """Charges `amount` (capped at each limit) to every account, or raises TokenLimitExceeded
    (nothing charged) with the seconds to wait. -> Reservation (empty when nothing is limited)."""
    if not accounts:
        return Reservation()
    return _admitted(accounts, amount, _bucket("admit", accounts, [amount] * len(accounts), now=now))


async def atokens_admit(accounts: Sequence[Account], amount: int, now: float | None = None) -> Reservation:
    """tokens_admit on the event loop."""
    if not accounts:
        return Reservation()
    result = await outage.ride_out(lambda: _abucket("admit", accounts, [amount] * len(accounts), now=now))
    return _admitted(accounts, amount, result)


def _admitted(accounts: Sequence[Account], amount: int, result: tuple[bool, float, list[float]]) -> Reservation:
    admitted, wait, levels = result
    if not admitted:
        i = max(range(len(accounts)), key=lambda k: min(amount, accounts[k][2]) - levels[k])
        limit = accounts[i][2]
        raise TokenLimitExceeded(wait, (limit, max(0, int(levels[i])), _refill_s(limit, levels[i])))
    return Reservation(accounts, [min(amount, limit) for _, _, limit in accounts], levels)


def accounts_for(request: Request) -> list[Account]:
    """The token accounts a request is charged to: [(scope, ident, limit)], the limited ones."""
    return limit_for(request, "tokens_per_minute")
