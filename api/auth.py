"""DRF authentication by API key: `Authorization: Bearer <key>` or `x-api-key: <key>`.
`aauthenticate` is the same on the event loop, for the views of api.loopview."""
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import User
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from api.keycache import akey_lookup, key_lookup
from api.models import ApiKey
from colibri_base.lean import database_call

BAD_KEY = "Incorrect API key provided."


def key_from_headers(meta: Mapping[str, Any]) -> str:
    auth = meta.get("HTTP_AUTHORIZATION", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return meta.get("HTTP_X_API_KEY", "").strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[User, ApiKey] | None:
        key = key_from_headers(request.META)
        if not key:
            return None  # -> NotAuthenticated (401) from IsAuthenticated
        row = key_lookup(key)
        if row is None:
            raise exceptions.AuthenticationFailed(BAD_KEY)
        row.touch()
        return row.user, row

    async def aauthenticate(self, request: Request) -> tuple[User, ApiKey] | None:
        key = key_from_headers(request.META)
        if not key:
            return None
        row = await akey_lookup(key)
        if row is None:
            raise exceptions.AuthenticationFailed(BAD_KEY)
        if row.touch_due():  # once a minute per key: the only database write on this path
            await database_call(row.touch)()
        return row.user, row

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"  # makes DRF answer 401, not 403
