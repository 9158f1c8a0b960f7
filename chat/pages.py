"""The chat page: an HTML shell; everything on it is drawn by frontend/src (built into app.js)."""
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import render


@login_required
def index(request: HttpRequest) -> HttpResponse:
    # The CSRF token goes to the script through json_script (never inline JS); get_token also
    # makes sure the csrftoken cookie is set for the JSON writes the page makes.
    # is_staff only decides whether a reply's "expert hits" links to the (staff-only) atlas.
    boot = {"username": request.user.get_username(), "csrf_token": get_token(request),
            "is_staff": request.user.is_staff}
    return render(request, "chat/index.html", {"boot": boot})
