"""The engine hosts as the reports show them: per bridge and per model, for /health, /v1/stats,
the ops page's figures and the atlas and ops host pickers (issue 26 item 3).

Why here: the registry (engine_bridge.registry) is the one source of which bridges live, where,
serving what and how loaded; every report reads it through fleet_report so that a bridge is
described alike everywhere, and a page's `?bridge=` choice is checked once (bridge_choice).

Invariants: a report lists only live bridges (a fresh heartbeat), sorted by id; a model's entry
sums the slots, busy slots and queue of the bridges serving it and is up while one of them is.
Reading the registry never raises: with Redis out the lists are empty (the caller's own facts
say Redis is down).
"""
from collections.abc import Callable

from colibri_base import metrics
from engine_bridge import registry, telemetry
from engine_bridge.registry import BridgeInfo


class UnknownBridge(LookupError):
    """A page asked for a bridge that is not live; `detail` names it and the live ones."""

    def __init__(self, bridge: str, live: list[str]) -> None:
        self.detail = f"no live bridge {bridge[:80]!r}; live: {', '.join(live) or 'none'}"
        super().__init__(self.detail)


def bridge_entry(b: BridgeInfo) -> dict:
    return {"id": b.id, "host": b.host, "model": b.model, "status": b.status, "slots": b.slots, "busy": b.busy,
            "queued": b.queued, "queue_limit": b.queue_limit, "context": b.context,
            "beat_age_s": round(b.beat_age_s, 3)}


def model_entries(bridges: list[BridgeInfo]) -> list[dict]:
    """One entry per model id the live bridges serve, sorted by id."""
    out = []
    for model in sorted({b.model for b in bridges}):
        serving = [b for b in bridges if b.model == model]
        out.append({"id": model, "bridges": [b.id for b in serving],
                    "status": "up" if any(b.status == "up" for b in serving) else serving[0].status,
                    "slots": sum(b.slots for b in serving), "busy": sum(b.busy for b in serving),
                    "queued": sum(b.queued for b in serving)})
    return out


def fleet_report(bridges: list[BridgeInfo]) -> dict:
    """{"bridges": [...], "models": [...], "default_bridge": id}: what every report adds."""
    live = sorted(bridges, key=lambda b: b.id)
    return {"bridges": [bridge_entry(b) for b in live], "models": model_entries(live),
            "default_bridge": registry.default_bridge(live)}


def fleet_get() -> dict:
    return fleet_report(registry.safe_bridges_get())


async def afleet_get() -> dict:
    return fleet_report(await registry.asafe_bridges_get())


def bridge_choice(bridge: str | None, bridges: list[BridgeInfo]) -> str:
    """The bridge a page shows: the one it asked for, if live (UnknownBridge otherwise), or the
    default one (registry.default_bridge)."""
    if not bridge:
        return registry.default_bridge(bridges)
    live = [b.id for b in bridges]
    if bridge not in live:
        raise UnknownBridge(bridge, live)
    return bridge


def stats(bridge: str | None = None) -> dict:
    """/v1/stats and the ops page's figures: colibri_base.metrics.stats with the engine figures of
    one bridge (`bridge`, or the default one), plus the fleet and which bridge `engine` is."""
    bridges = registry.safe_bridges_get()
    chosen = bridge_choice(bridge, bridges)
    read: Callable[[], dict] = lambda: telemetry.get_state(chosen)  # noqa: E731
    return {**metrics.stats(read), **fleet_report(bridges), "bridge": chosen}
