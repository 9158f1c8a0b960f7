from django.http import JsonResponse
from django.views.decorators.http import require_GET

from engine_bridge.telemetry import get_state


@require_GET
def experts(request):
    """The latest expert map for the atlas. Session login required (API-key auth may come later)."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "login required"}, status=401)
    state = get_state()
    emap, hits = state["emap"] or {}, state["hits"] or {}
    return JsonResponse({
        "rows": emap.get("rows", hits.get("rows", 0)),
        "cols": emap.get("cols", hits.get("cols", 0)),
        "map": emap.get("hex", ""),
        "hits": hits.get("hex", ""),
        "seq": state["seq"],
        "gpus": state["gpus"],
        "entropy": state["entropy"],
        "repin": state["repin"],
        "tiers": state["tiers"],
    })
