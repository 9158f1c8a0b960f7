"""Every frame the server sends on /ws/atlas/ (docs/contracts.md, "Expert atlas"), declared once.

The atlas consumer (experts/consumers.py) builds its frames only through the functions here, so
the page's type of a frame cannot drift from what the socket sends; the TypedDicts are what mypy
checks those functions against. The front end's `ServerFrame` union
(frontend/src/atlas/server_frames.ts) is generated from these declarations (`typescript()`, by
colibri_base.frames, written by `manage.py frames_ts`), and tests/experts/test_atlas_frames.py fails
when the file is stale, when a hand-written TS interface named in TS_NAMES lacks a key the server
sends, or when a frame the socket tests receive does not conform (`problems`).

The nested shapes come from elsewhere and are declared here as the page receives them: the
bridge's state fields (engine_bridge.telemetry, from the engine's TIERS / EMAP / HITS / REPIN
lines and a finished turn's DONE), a live bridge (engine_bridge.fleet.bridge_entry), a build and
an atlas (experts.models AtlasBuild.as_dict / Atlas.as_dict); the tests hold those producers to
the keys declared here.
"""
import typing
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict, Union

from colibri_base import frames


class GridData(TypedDict):
    """An EMAP or HITS bitmap: `rows` x `cols` cells as hex (EMAP: a tier byte per cell)."""

    rows: int
    cols: int
    hex: str


class TiersData(TypedDict):
    """The engine's TIERS line: experts and gigabytes per memory tier."""

    vram_experts: int
    ram_experts: int
    disk_experts: int
    vram_gb: float
    ram_gb: float


class RepinData(TypedDict):
    """One REPIN: `layer` the absolute layer (not the EMAP row), the tier the expert left."""

    layer: int
    expert: int
    old_tier: int
    gpu: int


class TurnData(TypedDict):
    """A finished turn's own figures (its DONE), as the bridge pushes them (`turn` items)."""

    hit_pct: float
    tok_s: float
    completion_tokens: int


class BridgeEntryData(TypedDict):
    """engine_bridge.fleet.bridge_entry: one live bridge, for the page's host picker."""

    id: str
    host: str
    model: str
    status: str
    slots: int
    busy: int
    queued: int
    queue_limit: int
    context: int
    beat_age_s: float


class BuildData(TypedDict):
    """experts.models.AtlasBuild.as_dict: one build's progress."""

    id: int
    model: str
    served_model: str
    status: str
    done: int
    total: int
    atlas: int | None
    error: str
    wall_s: float | None
    created: str


class AtlasInfoData(TypedDict):
    """experts.models.Atlas.as_dict: one stored atlas, without its content."""

    id: int
    model: str
    source: str
    sha256: str
    filename: str
    entries: int
    specialists: int
    categories: list[str]
    validation: dict[str, Any] | None
    bytes: int
    created: str


class LayerFields(TypedDict, total=False):
    """The EMAP rows' absolute layers and where that numbering came from
    (experts.services.row_layers); sent only when the number of rows changes."""

    layers: list[int]
    layer_source: str  # engine | atlas | atlas+extra | model | rows


class SnapshotFrame(TypedDict):
    """Once on connect: the bridge's state as get_state reads it (null where it has none yet)."""

    type: Literal["snapshot"]
    up: bool
    status: str
    model: dict[str, Any] | None
    tiers: TiersData | None
    emap: GridData | None
    entropy: list[float] | None
    busy: int
    queue: int
    hits: GridData | None
    seq: int
    updated: float | None  # the state's write time (epoch seconds); null: no bridge has written it
    layers: NotRequired[list[int]]
    layer_source: NotRequired[str]
    bridge: str
    bridges: list[BridgeEntryData]


class TelemetryFrame(TypedDict):
    """What the group brought within one flush, coalesced: only the keys that arrived."""

    type: Literal["telemetry"]
    up: NotRequired[bool]
    status: NotRequired[str]
    model: NotRequired[dict[str, Any] | None]
    tiers: NotRequired[TiersData | None]
    emap: NotRequired[GridData | None]
    entropy: NotRequired[list[float] | None]
    busy: NotRequired[int]
    queue: NotRequired[int]
    hits: NotRequired[GridData]  # the OR of the HITS windows of one shape
    windows: NotRequired[int]  # how many HITS windows `hits` merges
    repin: NotRequired[list[RepinData]]  # every REPIN, in order
    turns: NotRequired[list[TurnData]]  # every finished turn's figures, in order
    layers: NotRequired[list[int]]
    layer_source: NotRequired[str]


class BuildFrame(TypedDict):
    type: Literal["build"]
    build: BuildData


class AtlasFrame(TypedDict):
    type: Literal["atlas"]
    atlas: AtlasInfoData


class ErrorFrame(TypedDict):
    """The socket's query was refused (the socket closes next); `field` names the query key."""

    type: Literal["error"]
    field: str
    detail: str


ServerFrame = Union[SnapshotFrame, TelemetryFrame, BuildFrame, AtlasFrame, ErrorFrame]
FRAMES: tuple[type, ...] = typing.get_args(ServerFrame)
# Nested shapes the front end declares by hand (its HTTP calls and pages use them too): by name.
TS_NAMES: dict[type, str] = {GridData: "Grid", TiersData: "TiersInfo", RepinData: "Repin",
                             BridgeEntryData: "BridgeEntry", BuildData: "Build", AtlasInfoData: "AtlasInfo"}

# The state fields a telemetry frame carries at their newest value (the consumer keeps the last
# one that arrived); the other telemetry keys are gathered (hits, windows, repin, turns).
Latest = Literal["up", "status", "model", "tiers", "emap", "entropy", "busy", "queue"]
LATEST: tuple[Latest, ...] = typing.get_args(Latest)
Gathered = Literal["hits", "windows", "repin", "turns"]
GATHERED: tuple[Gathered, ...] = typing.get_args(Gathered)


def snapshot(state: Mapping[str, Any], layers: LayerFields, bridge: str,
             bridges: list[BridgeEntryData]) -> SnapshotFrame:
    """From the bridge's state as engine_bridge.telemetry.get_state answers it (every field
    present: it starts from empty_state). No `repin`: the state's last REPINs happened before the
    page opened (they carry no time), and the page's timeline lists only the changes it sees arrive."""
    frame: SnapshotFrame = {
        "type": "snapshot", "up": state["up"], "status": state["status"], "model": state["model"],
        "tiers": state["tiers"], "emap": state["emap"], "entropy": state["entropy"], "busy": state["busy"],
        "queue": state["queue"], "hits": state["hits"], "seq": state["seq"], "updated": state["updated"],
        "bridge": bridge, "bridges": bridges,
    }
    if "layers" in layers:
        frame["layers"] = layers["layers"]
    if "layer_source" in layers:
        frame["layer_source"] = layers["layer_source"]
    return frame


def telemetry(coalesced: Mapping[str, Any], layers: LayerFields) -> TelemetryFrame:
    """From what one socket coalesced within a flush, keyed as the frame (LATEST and GATHERED):
    only the keys that arrived are present."""
    frame: TelemetryFrame = {"type": "telemetry"}
    for key in LATEST + GATHERED:
        if key in coalesced:
            frame[key] = coalesced[key]
    if "layers" in layers:
        frame["layers"] = layers["layers"]
    if "layer_source" in layers:
        frame["layer_source"] = layers["layer_source"]
    return frame


def build(data: BuildData) -> BuildFrame:
    return {"type": "build", "build": data}


def atlas(info: AtlasInfoData) -> AtlasFrame:
    return {"type": "atlas", "atlas": info}


def error(field: str, detail: str) -> ErrorFrame:
    return {"type": "error", "field": field, "detail": detail}


# --- the declarations as data (colibri_base.frames): TypeScript, and a runtime check for tests ---

FRAME_SET = frames.FrameSet(
    source="experts/server_frames.py", target="frontend/src/atlas/server_frames.ts",
    test="tests/experts/test_atlas_frames.py", union="ServerFrame", frames=FRAMES, ts_names=TS_NAMES,
    ts_files={"Grid": "frontend/src/atlas/types.ts", "TiersInfo": "frontend/src/atlas/types.ts",
              "Repin": "frontend/src/atlas/types.ts", "Build": "frontend/src/atlas/types.ts",
              "AtlasInfo": "frontend/src/atlas/types.ts", "BridgeEntry": "frontend/src/hosts.ts"})
frame_type = frames.frame_type


def typescript() -> str:
    """frontend/src/atlas/server_frames.ts: the ServerFrame union, one member per frame."""
    return FRAME_SET.typescript()


def problems(frame: object) -> list[str]:
    """What makes `frame` differ from its declaration (empty: it conforms); for tests."""
    return FRAME_SET.problems(frame)
