from django.http import JsonResponse
from django.views.decorators.http import require_GET

from engine_bridge.telemetry import get_state


@require_GET
def health(request):
    """200 when the engine is up, 503 otherwise (load balancers and the status page read this)."""
    state = get_state()
    status = state["status"] if state["updated"] is not None else "down"
    model = state["model"] or {}
    body = {
        "engine": status,
        "model": model.get("name"),
        "slots": state["slots"],
        "queue": state["queue"],
        "restarts": state["restarts"],
    }
    return JsonResponse(body, status=200 if state["up"] else 503)
