"""/health: what a load balancer, a supervisor or a status page asks. Always JSON, never a 500 page:
it must answer most reliably exactly when something is down."""
import redis
from django.http import JsonResponse
from django.views.decorators.http import require_GET

from engine_bridge import liveness, sampling
from engine_bridge.telemetry import get_state


@require_GET
def health(request):
    """200 when Redis, the bridge and the engine are up; 503 (with Retry-After) otherwise."""
    try:
        state = get_state()
        boot = liveness.get_boot()
    except (redis.RedisError, OSError):
        state, boot = None, None
    if state is None or boot is None:
        body = {"engine": "unknown", "bridge": "unknown", "redis": "down", "model": None,
                "slots": None, "queue": None, "restarts": None, "experts": None, "sampling": None}
        return _answer(body, up=False)
    status = state["status"] if state["updated"] is not None and boot else "down"
    model = state["model"] or {}
    experts = None
    if model.get("experts_max"):  # our engine: the per-request expert count it takes
        experts = {"default": model.get("top_k"), "min": model.get("experts_min"), "max": model.get("experts_max")}
    body = {
        "engine": status,
        "bridge": "up" if boot else "down",
        "redis": "up",
        "model": model.get("name"),
        "slots": state["slots"],
        "queue": state["queue"],
        "restarts": state["restarts"],
        "experts": experts,
        # what a request that names no temperature / top_p gets (the model's recommendation, or ours)
        "sampling": dict(zip(("temperature", "top_p"), sampling.model_defaults(model))),
    }
    return _answer(body, up=bool(state["up"] and boot))


def _answer(body, *, up):
    response = JsonResponse(body, status=200 if up else 503)
    if not up:
        response["Retry-After"] = "5"
    response["Cache-Control"] = "no-store"
    return response
