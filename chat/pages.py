"""The chat page: an HTML shell; everything on it is drawn by frontend/src (built into app.js)."""
from django.contrib.auth.decorators import login_required
from django.middleware.csrf import get_token
from django.shortcuts import render


@login_required
def index(request):
    # The CSRF token goes to the script through json_script (never inline JS); get_token also
    # makes sure the csrftoken cookie is set for the JSON writes the page makes.
    boot = {"username": request.user.get_username(), "csrf_token": get_token(request)}
    return render(request, "chat/index.html", {"boot": boot})
