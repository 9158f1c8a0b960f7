"""/health: what a load balancer, a supervisor or a status page asks. Always JSON, never a 500 page:
it must answer most reliably exactly when something is down.

Invariants (issue 24): it answers within about a second under every fault — two Redis round trips
on the event loop (the registry, then the default bridge's facts), each bounded by
liveness.HEALTH_TIMEOUT_S (a frozen Redis costs the first bound, not a blocked worker thread),
served on the API's short chain (settings.API_LEAN_PATHS: no page middleware thread hops) — and from fresh facts only: the bridge is up while its heartbeat is at
most liveness.STALE_S old (the key itself lingers TTL seconds after a kill), the engine is up while
the bridge says so and does not find it stopped or silent (telemetry `hung`). Each failing part is
named: `redis`, `bridge` or `engine` is not "up", and the answer is 503 with Retry-After.
"""
import asyncio

import redis
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from engine_bridge import fleet, liveness, registry
from engine_bridge.registry import BridgeInfo
from engine_bridge.served import served_model_from
from engine_bridge.telemetry import decode_state


async def _live_bridges() -> list[BridgeInfo] | None:
    """The registry's live bridges, or None when Redis did not answer within HEALTH_TIMEOUT_S."""
    try:
        async with asyncio.timeout(liveness.HEALTH_TIMEOUT_S):
            return await registry.abridges_get()
    except (redis.RedisError, OSError, TimeoutError):
        return None


@require_GET
async def health(request: HttpRequest) -> JsonResponse:
    """200 when Redis, the default bridge and its engine are up; 503 (with Retry-After) otherwise.
    `bridges` and `models` report every live bridge (id, host, model, status, slots, busy,
    queued) and model; the top-level fields are the default bridge's (`bridge_id`)."""
    bridges = await _live_bridges()
    facts = None if bridges is None else await liveness.ahealth_facts(registry.default_bridge(bridges))
    if facts is None:
        body: dict[str, object] = {"engine": "unknown", "bridge": "unknown", "redis": "down", "model": None,
                                   "slots": None, "queue": None, "restarts": None, "experts": None,
                                   "sampling": None, "memory": None, "refusal": None, "bridge_id": None,
                                   "bridges": [], "models": []}
        return _answer(body, up=False)
    assert bridges is not None  # facts were read from them
    state = decode_state(facts.state_raw)
    beating = facts.bridge_beating
    status = state["status"] if state["updated"] is not None and beating else "down"
    if status == "up" and state.get("hung"):
        status = "hung"  # the bridge found the engine stopped (SIGSTOP) or not answering its ping
    served = served_model_from(state)  # the one reader of the model's facts
    experts = None
    if served.experts_range:  # our engine: the per-request expert count it takes
        experts = {"default": served.experts_default, "min": served.experts_range[0], "max": served.experts_range[1]}
    body = {
        "engine": status,
        "bridge": "up" if beating else "down",
        "redis": "up",
        "model": (state["model"] or {}).get("name"),
        "slots": state["slots"],
        "queue": state["queue"],
        "restarts": state["restarts"],
        "experts": experts,
        # what a request that names no temperature / top_p gets (the model's recommendation, or ours)
        "sampling": dict(zip(("temperature", "top_p"), served.sampling_defaults)),
        # how our engine split its memory budget (MODEL's `memory`; null for another engine)
        "memory": (state["model"] or {}).get("memory"),
        # engine "refused": the engine's one-line reason for refusing its model file (else null)
        "refusal": state.get("refused") if status == "refused" else None,
        **_fleet(fleet.fleet_report(bridges)),
    }
    return _answer(body, up=bool(state["up"] and beating and status == "up"))


def _fleet(report: dict) -> dict:
    return {"bridge_id": report["default_bridge"], "bridges": report["bridges"], "models": report["models"]}


def _answer(body: dict[str, object], *, up: bool) -> JsonResponse:
    response = JsonResponse(body, status=200 if up else 503)
    if not up:
        response["Retry-After"] = "5"
    response["Cache-Control"] = "no-store"
    return response
