"""DRF authentication by API key: `Authorization: Bearer <key>` or `x-api-key: <key>`."""
from rest_framework import authentication, exceptions

from api.keycache import key_lookup


def key_from_headers(meta):
    auth = meta.get("HTTP_AUTHORIZATION", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return meta.get("HTTP_X_API_KEY", "").strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        key = key_from_headers(request.META)
        if not key:
            return None  # -> NotAuthenticated (401) from IsAuthenticated
        row = key_lookup(key)
        if row is None:
            raise exceptions.AuthenticationFailed("Incorrect API key provided.")
        row.touch()
        return row.user, row

    def authenticate_header(self, request):
        return "Bearer"  # makes DRF answer 401, not 403
