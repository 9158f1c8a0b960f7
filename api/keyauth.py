"""API keys for a few JSON routes outside /v1: a staff user's key reads /experts like its session.

The apps sit on one floor (experts/ never imports api/), so the project wires it: settings.MIDDLEWARE
installs this middleware of api's, and for the paths in settings.API_KEY_PATHS a request with
`Authorization: Bearer <key>` (or `x-api-key`) and no session user is authenticated as the key's
owner. The route's own rule (staff only) still decides.
A bad key is answered 401 here, in JSON, naming the problem. CSRF does not apply to these GET routes.
"""
from collections.abc import Awaitable, Callable
from typing import cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from api.auth import key_from_headers
from api.models import ApiKey


def _applies(request: HttpRequest) -> bool:
    return any(request.path.startswith(p) for p in settings.API_KEY_PATHS) and not request.user.is_authenticated


def _authenticate(request: HttpRequest) -> JsonResponse | None:
    """None when the request may go on (no key, or a good one); else the 401 answer."""
    key = key_from_headers(request.META)
    if not key:
        return None
    row = ApiKey.lookup(key)
    if row is None:
        return JsonResponse({"error": "Incorrect API key provided."}, status=401)
    row.touch()
    request.user = row.user
    return None


class ApiKeyUserMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if self.is_async:
            return self._acall(request)
        refusal = _authenticate(request) if _applies(request) else None
        return refusal or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        if await sync_to_async(_applies)(request):
            refusal = await sync_to_async(_authenticate)(request)
            if refusal:
                return refusal
        return await cast(Awaitable[HttpResponse], self.get_response(request))  # async: is_async said so
