"""The operator's page: /metrics and /v1/stats as live charts, for staff.

`GET /ops` (staff session; anonymous -> login, members 403) is the page; the script polls
`GET /ops/stats.json` (staff session; 401 / 403 JSON otherwise), which serves exactly what
/v1/stats serves (colibri_site.metrics.stats(): the same registry /metrics renders, every web
process and the bridge's telemetry) plus the server time, so a staff member's browser needs no
API key. The page computes rates and interval means from the cumulative counters itself.
"""
import time

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from colibri_site import metrics

POLL_S = 2


@require_GET
def ops_page(request):
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not request.user.is_staff:
        raise PermissionDenied("staff only")
    return render(request, "ops/index.html", {"boot": {"poll_s": POLL_S, "stats_url": "/ops/stats.json",
                                                       "surfaces": list(metrics.SURFACES)}})


@require_GET
@never_cache
def ops_stats(request):
    if not request.user.is_authenticated:
        return JsonResponse({"error": "login required"}, status=401)
    if not request.user.is_staff:
        return JsonResponse({"error": "staff only"}, status=403)
    return JsonResponse({"time": time.time(), **metrics.stats()})
