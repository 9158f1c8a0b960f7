"""Who may see the experts: staff only (the atlas shows the whole routing of every conversation).

A staff user's API key works too (`Authorization: Bearer` or `x-api-key`): the project's
colibri_site/keyauth.py middleware authenticates keys on the /experts routes, so this app never
imports api/.
"""
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse


def staff_json(view):
    """JSON endpoints: 401 when not signed in, 403 for non-staff."""
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return JsonResponse({"error": "login required"}, status=401)
        if not request.user.is_staff:
            return JsonResponse({"error": "staff only"}, status=403)
        return view(request, *args, **kwargs)
    return wrapped


def staff_page(view):
    """HTML pages: the login page when not signed in, 403 for non-staff."""
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("staff only")
        return view(request, *args, **kwargs)
    return wrapped
