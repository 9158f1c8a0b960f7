"""The operator's page: /metrics and /v1/stats as live charts, for staff.

`GET /ops` (staff session; anonymous -> login, members 403) is the page; the script polls
`GET /ops/stats.json` (staff session; 401 / 403 JSON otherwise), which serves exactly what
/v1/stats serves (colibri_base.metrics.stats(): the same registry /metrics renders, every web
process and the bridge's telemetry) plus the server time, so a staff member's browser needs no
API key. The page computes rates and interval means from the cumulative counters itself; its
host picker (fed by the answer's `bridges`) asks for one engine host's figures with `?bridge=`.
"""
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from colibri_base import metrics
from colibri_base.access import staff_json, staff_page
from engine_bridge import fleet

POLL_S = 2


@require_GET
@staff_page
def ops_page(request: HttpRequest) -> HttpResponse:
    return render(request, "ops/index.html", {"boot": {"poll_s": POLL_S, "stats_url": "/ops/stats.json",
                                                       "surfaces": list(metrics.SURFACES)}})


@require_GET
@never_cache
@staff_json
def ops_stats(request: HttpRequest) -> JsonResponse:
    """`?bridge=<id>`: that engine host's figures (the page's host picker); 404 naming a bridge
    that is not live."""
    try:
        return JsonResponse({"time": time.time(), **fleet.stats(request.GET.get("bridge"))})
    except fleet.UnknownBridge as exc:
        return JsonResponse({"error": exc.detail, "field": "bridge"}, status=404)
