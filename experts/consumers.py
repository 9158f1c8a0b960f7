"""The atlas websocket (/ws/atlas/): staff only; pushes telemetry and builder progress.

The bridge sends every telemetry update to the Channels group `telemetry` (one HITS window per
item, possibly hundreds a second on a fast engine). A browser does not need that rate: each
connection coalesces what arrives within FLUSH_S — HITS bitmaps OR-ed together, the newest
EMAP/TIERS/ENTROPY kept, REPINs (and `turn` items, a finished turn's DONE figures, if the bridge
sends them) appended — and sends one frame. The `windows` count says how many HITS windows a frame
merges, so the page's rates stay honest.

One engine host at a time (issue 26 item 3): `/ws/atlas/?bridge=<id>` shows that bridge (the
page's host picker, fed by the snapshot's `bridges`), no query the default one; a bridge that is
not live closes the socket with CLOSE_UNKNOWN_BRIDGE. Pushes of other bridges are dropped.

Every frame is built by experts/server_frames.py (the page's ServerFrame type is generated from it).
"""
import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from colibri_base import socket_access
from engine_bridge import fleet, registry, telemetry
from experts import server_frames, services
from experts.atlas_format import parse_key

FLUSH_S = 0.05
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_UNKNOWN_BRIDGE = 4404
LATEST = server_frames.LATEST  # the state fields a frame carries at their newest value


_access_valid = database_sync_to_async(socket_access.socket_access_valid)


def or_hits(a: str | None, b: str) -> str:
    """The union of two HITS bitmaps of the same shape (hex strings of equal length)."""
    if not a:
        return b
    merged = int(a, 16) | int(b, 16)
    return format(merged, f"0{len(a)}x")


@database_sync_to_async
def _layers(rows: int, model: dict | None) -> tuple[list[int], str]:
    atlas = services.atlas_current(model_name=services.model_name_current(state={"model": model}))
    atlas_layers: set[int] = set()
    if atlas is not None:
        atlas_layers = {parse_key(p[0])[0] for p in atlas.projection.get("points", [])}
    return services.row_layers(rows=rows, model=model, atlas_layers=atlas_layers)


def _asked_bridge(scope: Mapping[str, object]) -> str | None:
    """The `bridge` of the socket's query string, if any."""
    raw = scope.get("query_string")
    query = parse_qs(raw.decode("latin-1") if isinstance(raw, bytes) else "")
    return next(iter(query.get("bridge", [])), None)


class AtlasConsumer(AsyncJsonWebsocketConsumer):
    # Set by connect once the socket is accepted (disconnect tells by `pending` whether it was).
    bridge: str
    pending: dict[str, Any]
    flush_handle: asyncio.TimerHandle | None
    rows: int | None
    model: dict | None
    access_watch: asyncio.Task[None]

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()  # then close with a code the page can tell apart (as /ws/chat/ does)
        if user is None or not user.is_authenticated:
            return await self.close(code=CLOSE_UNAUTHENTICATED)
        if not user.is_staff:
            return await self.close(code=CLOSE_FORBIDDEN)
        bridges = await registry.asafe_bridges_get()
        try:
            self.bridge = fleet.bridge_choice(_asked_bridge(self.scope), bridges)
        except fleet.UnknownBridge as exc:
            await self.send_json(server_frames.error("bridge", exc.detail))
            return await self.close(code=CLOSE_UNKNOWN_BRIDGE)
        self.pending, self.flush_handle, self.rows, self.model = {}, None, None, None
        self.access_watch = asyncio.create_task(self._watch_access(user.pk))
        await self.channel_layer.group_add(telemetry.GROUP, self.channel_name)
        await self.channel_layer.group_add(services.BUILD_GROUP, self.channel_name)
        state = await telemetry.aget_state(self.bridge)
        layers = await self._layer_fields(state.get("emap"), state.get("model"))
        report = fleet.fleet_report(bridges)
        await self.send_json(server_frames.snapshot(state, layers, self.bridge, report["bridges"]))

    async def _watch_access(self, user_id: int) -> None:
        """Closes the socket (4401) once its user is no longer active staff or its session expired
        or was deleted: it is checked every socket_access.CHECK_S (issue 24)."""
        session_key = getattr(self.scope.get("session"), "session_key", None)
        while True:
            await asyncio.sleep(socket_access.CHECK_S)
            try:
                valid = await _access_valid(user_id, session_key, staff=True)
            except Exception:  # a database hiccup is not a revocation
                continue
            if not valid:
                await self.close(code=CLOSE_UNAUTHENTICATED)
                return

    async def disconnect(self, code: int) -> None:
        if getattr(self, "pending", None) is None:
            return
        watch = getattr(self, "access_watch", None)
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
        if self.flush_handle is not None:
            self.flush_handle.cancel()
        await self.channel_layer.group_discard(telemetry.GROUP, self.channel_name)
        await self.channel_layer.group_discard(services.BUILD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        pass  # the page only listens

    async def _layer_fields(self, emap: dict | None, model: dict | None) -> server_frames.LayerFields:
        """The EMAP rows' layers, only when the number of rows changed since the last frame."""
        if model is not None:
            self.model = model
        rows = (emap or {}).get("rows")
        if rows is None or rows == self.rows:
            return {}
        self.rows = rows
        layers, source = await _layers(rows, self.model)
        return {"layers": layers, "layer_source": source}

    async def telemetry_batch(self, event: dict[str, Any]) -> None:
        if event.get("bridge", self.bridge) != self.bridge:
            return  # another engine host's telemetry
        p = self.pending
        for item in event["items"]:
            if "hits" in item and item["hits"]:
                hits = item["hits"]
                same = p.get("hits") and (p["hits"]["rows"], p["hits"]["cols"]) == (hits["rows"], hits["cols"])
                p["hits"] = {**hits, "hex": or_hits(p["hits"]["hex"], hits["hex"]) if same else hits["hex"]}
                p["windows"] = p.get("windows", 0) + 1 if same else 1
            if "repin" in item:
                p.setdefault("repin", []).append(item["repin"])
            if "turn" in item:  # a finished turn's own figures (DONE's hit_pct), when the bridge sends them
                p.setdefault("turns", []).append(item["turn"])
            for key in LATEST:
                if key in item:
                    p[key] = item[key]
        if self.flush_handle is None:
            self.flush_handle = asyncio.get_running_loop().call_later(
                FLUSH_S, lambda: asyncio.ensure_future(self._flush()))

    async def _flush(self) -> None:
        self.flush_handle = None
        coalesced, self.pending = self.pending, {}
        if not coalesced:
            return
        layers = await self._layer_fields(coalesced.get("emap"), coalesced.get("model"))
        await self.send_json(server_frames.telemetry(coalesced, layers))

    async def atlas_build(self, event: dict[str, Any]) -> None:
        await self.send_json(server_frames.build(event["build"]))

    async def atlas_saved(self, event: dict[str, Any]) -> None:
        await self.send_json(server_frames.atlas(event["atlas"]))
