"""Staff-only views: the atlas (it shows the whole routing of every conversation), a chat
message's routing, the operator's page.

A staff user's API key works too (`Authorization: Bearer` or `x-api-key`) on the paths of
settings.API_KEY_PATHS: api/keyauth.py, a middleware the project installs, authenticates keys
there before the view runs, so no app that uses these decorators imports api/.
Invariant: JSON routes answer 401 / 403 in JSON, pages redirect to the login page or answer 403.
"""
from collections.abc import Callable
from functools import wraps
from typing import cast

from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.request import Request

View = Callable[..., HttpResponse]


def signed_in_user(request: HttpRequest | Request) -> User:
    """The user of a request that a sign-in check let through (these decorators, DRF's
    IsAuthenticated): a User, never the AnonymousUser its type also allows."""
    return cast(User, request.user)


def staff_json(view: View) -> View:
    """JSON endpoints: 401 when not signed in, 403 for non-staff."""
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_authenticated:
            return JsonResponse({"error": "login required"}, status=401)
        if not request.user.is_staff:
            return JsonResponse({"error": "staff only"}, status=403)
        return view(request, *args, **kwargs)
    return wrapped


def staff_page(view: View) -> View:
    """HTML pages: the login page when not signed in, 403 for non-staff."""
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        return view(request, *args, **kwargs)
    return wrapped
