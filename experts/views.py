"""Thin views over experts.services: the telemetry JSON, the atlas page and its JSON endpoints.
Every view is staff only (colibri_base/access.py). The library's endpoints take the page's
engine host (`?bridge=<id>`, or a POST's `bridge` field) and answer for the model it serves;
a bridge that is not live is a 404 naming it (engine_bridge.fleet.UnknownBridge)."""
from collections.abc import Callable
from functools import wraps

import redis
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_http_methods

from colibri_base.access import signed_in_user, staff_json, staff_page
from engine_bridge import fleet, registry, telemetry
from engine_bridge.fleet import UnknownBridge
from engine_bridge.transport import BROKER_DOWN
from engine_bridge.served import ServedModel
from experts import services, tasks
from experts.atlas_format import AtlasFormatError
from experts.models import Atlas, AtlasBuild


def _served(request: HttpRequest) -> ServedModel:
    """The model of the page's bridge (its query, else a POST's form field; none: the default)."""
    return services.model_served_get(bridge=request.GET.get("bridge") or request.POST.get("bridge"))


def _bridge_refusal(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """UnknownBridge raised in the view as a 404 naming the bridge (as /ops/stats.json says it)."""
    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except UnknownBridge as exc:
            return JsonResponse({"error": exc.detail, "field": "bridge"}, status=404)
    return wrapped


@require_GET
@staff_json
@_bridge_refusal
def experts(request: HttpRequest) -> JsonResponse:
    """The latest expert map of the page's bridge (`?bridge=`, else the default one), in the seed's
    shape (colibri's /experts plus gpus/entropy/repin/tiers); 503 while Redis, where the telemetry
    lives, does not answer (an empty map would read as an engine with no experts)."""
    try:
        state = telemetry.get_state(fleet.bridge_choice(request.GET.get("bridge"), registry.bridges_get()))
    except (redis.RedisError, OSError):
        return JsonResponse({"error": BROKER_DOWN}, status=503, headers={"Retry-After": "2"})
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


def _file_response(atlas: Atlas, attachment: bool) -> HttpResponse:
    response = HttpResponse(bytes(atlas.content), content_type="application/json")
    if attachment:
        response["Content-Disposition"] = 'attachment; filename="experts.json"'
    response["X-Atlas-Id"] = str(atlas.pk)
    return response


@require_GET
@staff_json
@_bridge_refusal
def experts_json(request: HttpRequest) -> HttpResponse:
    """The current experts.json of the model the engine runs (colibri's UI reads /experts.json)."""
    atlas = services.atlas_current(model_name=_served(request).display_name)
    if atlas is None:
        return JsonResponse({"error": "no atlas for this model yet"}, status=404)
    return _file_response(atlas, attachment=False)


@require_GET
@staff_page
def atlas_page(request: HttpRequest) -> HttpResponse:
    boot = {"csrf_token": get_token(request), "username": request.user.get_username()}
    return render(request, "experts/atlas.html", {"boot": boot})


@require_http_methods(["GET", "POST"])
@staff_json
@_bridge_refusal
def atlases(request: HttpRequest) -> JsonResponse:
    """GET: the bridge's model, its current atlas and the history of all atlases.
    POST (multipart `file`, optional `model`): import a colibri experts.json."""
    served = _served(request)
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            return JsonResponse({"error": "attach the experts.json as 'file'"}, status=400)
        model_name = request.POST.get("model") or served.display_name
        try:
            atlas = services.atlas_import(content=upload.read(), model_name=model_name,
                                          filename=upload.name or "", user=signed_in_user(request))
        except AtlasFormatError as exc:
            return JsonResponse({"error": str(exc)}, status=400)
        return JsonResponse({"atlas": atlas.as_dict()}, status=201)
    current = services.atlas_current(model_name=served.display_name)
    return JsonResponse({
        "model": served.display_name,
        "model_id": served.id,
        "current": current.as_dict() if current else None,
        "history": [a.as_dict() for a in services.atlas_history()],
    })


@require_GET
@staff_json
def atlas_download(request: HttpRequest, pk: int) -> HttpResponse:
    return _file_response(get_object_or_404(Atlas, pk=pk), attachment=True)


@require_GET
@staff_json
def atlas_map(request: HttpRequest, pk: int) -> JsonResponse:
    """The server-side 2-D projection of every expert's affinity vector."""
    atlas = get_object_or_404(Atlas.objects.only("projection"), pk=pk)
    return JsonResponse(atlas.projection)


@require_http_methods(["GET", "POST"])
@staff_json
@_bridge_refusal
def builds(request: HttpRequest) -> JsonResponse:
    """GET: recent builds (with a bridge: of its model). POST: start a build of the bridge's
    model's atlas (one per model at a time)."""
    if request.method == "POST":
        build = services.build_start(user=signed_in_user(request), model=_served(request),
                                     enqueue=tasks.build_atlas.delay)
        return JsonResponse({"build": build.as_dict()}, status=202)
    recent = AtlasBuild.objects.all()
    if request.GET.get("bridge"):
        recent = recent.filter(model_name=_served(request).display_name)
    return JsonResponse({"builds": [b.as_dict() for b in recent[:10]]})


@require_http_methods(["POST"])
@staff_json
def build_cancel(request: HttpRequest, pk: int) -> JsonResponse:
    build = services.build_cancel(build=get_object_or_404(AtlasBuild, pk=pk))
    return JsonResponse({"build": build.as_dict()})

