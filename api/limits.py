"""Per-key and per-user admission limits for the /v1 generation routes: requests per minute (DRF's
SimpleRateThrottle) and tokens per minute (prompt + completion, counted when a generation ends),
both kept in the default cache — Redis — so every web process shares them.

Limits come from the ApiKey row, the user's UserApiLimit row (both set by staff in the admin),
then settings.API_DEFAULT_REQUESTS_PER_MINUTE / API_DEFAULT_TOKENS_PER_MINUTE; none = unlimited.
A refusal is DRF's Throttled -> 429 in the surface's envelope with Retry-After (api.errors).
The token window is fixed (the current minute): a request is admitted while the window's count is
under the limit, so one request may overshoot it; the next ones wait for the next minute.
"""
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

WINDOW_S = 60


def _user_limits(user):
    try:
        return user.api_limit
    except Exception:  # no row (RelatedObjectDoesNotExist) or an anonymous user
        return None


def limit_for(request, field):
    """[(scope, ident, limit per minute)] for the key, then the user; only the limited ones."""
    default = getattr(settings, f"API_DEFAULT_{field.upper()}", None)
    key, user = request.auth, request.user
    if not hasattr(request, "_api_user_limits"):  # one query per request, not one per throttle
        request._api_user_limits = _user_limits(user)
    user_row = request._api_user_limits
    out = []
    if key is not None and getattr(key, field, None):
        out.append(("key", key.prefix, getattr(key, field)))
    user_limit = getattr(user_row, field, None) if user_row else None
    if user_limit or default:
        out.append(("user", f"{user.pk}-{int(user.date_joined.timestamp())}", user_limit or default))
    return out


class _PerMinute(SimpleRateThrottle):
    """SimpleRateThrottle whose rate is read per request from the rows above."""

    scope_name = None

    def __init__(self):  # the rate is not known before the request
        self.rate = None

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": f"api_rpm_{self.scope_name}", "ident": self.ident}

    def allow_request(self, request, view):
        for scope, ident, limit in limit_for(request, "requests_per_minute"):
            if scope == self.scope_name:
                self.ident, self.rate = ident, f"{limit}/m"
                self.num_requests, self.duration = limit, WINDOW_S
                return super().allow_request(request, view)
        return True


class KeyRequestThrottle(_PerMinute):
    scope_name = "key"


class UserRequestThrottle(_PerMinute):
    scope_name = "user"


def _window(now=None):
    return int((now or time.time()) // WINDOW_S)


def _token_key(scope, ident, window):
    return f"api_tpm:{scope}:{ident}:{window}"


class TokenThrottle(BaseThrottle):
    def allow_request(self, request, view):
        window = _window()
        for scope, ident, limit in limit_for(request, "tokens_per_minute"):
            if (cache.get(_token_key(scope, ident, window)) or 0) >= limit:
                return False
        return True

    def wait(self):
        return WINDOW_S - time.time() % WINDOW_S


def tokens_record(accounts, n):
    """Adds n tokens to the current window of each (scope, ident) in accounts."""
    if not n:
        return
    window = _window()
    for scope, ident in accounts:
        key = _token_key(scope, ident, window)
        cache.add(key, 0, timeout=2 * WINDOW_S)
        try:
            cache.incr(key, n)
        except ValueError:  # expired between add and incr
            cache.set(key, n, timeout=2 * WINDOW_S)


def accounts_for(request):
    """The token accounts a request is charged to (only those with a token limit)."""
    return [(scope, ident) for scope, ident, _ in limit_for(request, "tokens_per_minute")]
