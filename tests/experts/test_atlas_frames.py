"""The atlas socket's server frames in one funnel (experts/server_frames.py) and the page's type of
them: the generated ServerFrame union must be what the declarations say, the hand-written
interfaces it names (Grid, TiersInfo, Repin, BridgeEntry, Build, AtlasInfo) must declare every key
the server sends, the producers of the nested shapes must have exactly the declared keys, and
every frame-building path in experts/ must go through the funnel. The frames the real consumer
sends are held to the declarations in tests/experts/test_atlas_socket.py (`receive`)."""
import io
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from colibri_base.frames import COMMAND, interface_keys
from colibri_site.management.commands import frames_ts
from engine_bridge import fleet, protocol, telemetry
from engine_bridge.registry import BridgeInfo
from engine_bridge.telemetry_events import EngineTelemetry
from experts import server_frames
from experts.models import Atlas, AtlasBuild
from tests.support.frames import hand_built_frames

ROOT = Path(__file__).resolve().parents[2]
FRAME_SET = server_frames.FRAME_SET


def test_the_pages_server_frame_type_is_generated_from_the_declarations():
    on_disk = (ROOT / FRAME_SET.target).read_text()
    assert on_disk == server_frames.typescript(), (
        f"{FRAME_SET.target} is stale: run `{COMMAND}` (then `npm run build` in frontend/)")
    # The drift this replaced: the hand-written union had no seq / updated on the snapshot and
    # took each bridge entry for seven keys.
    snapshot_line = next(line for line in on_disk.splitlines() if '"snapshot"' in line)
    assert "seq: number" in snapshot_line and "updated: number | null" in snapshot_line


def test_the_command_writes_every_apps_file_and_check_finds_none_stale():
    """One command for every socket app: each app that declares server frames is in FRAME_SETS."""
    apps = {p.parent.name for p in ROOT.glob("*/server_frames.py")}
    assert {fs.source.split("/")[0] for fs in frames_ts.FRAME_SETS} == apps == {"chat", "experts"}
    call_command("frames_ts", "--check", stdout=io.StringIO(), stderr=io.StringIO())


@pytest.mark.parametrize("data,ts_name", list(server_frames.TS_NAMES.items()))
def test_the_hand_written_interfaces_declare_every_key_the_server_sends(data, ts_name):
    ts_file = FRAME_SET.ts_files[ts_name]
    ts = interface_keys((ROOT / ts_file).read_text(), ts_name)
    assert ts is not None, f"{ts_file} declares no interface {ts_name}"
    missing = [k for k in data.__annotations__ if k not in ts]
    assert missing == [], f"{ts_file} {ts_name} lacks {missing}"
    # A key TS requires must be one the server always sends.
    required_in_ts = {k for k, optional in ts.items() if not optional}
    assert required_in_ts <= data.__required_keys__, required_in_ts - data.__required_keys__


def test_the_producers_have_exactly_the_declared_keys():
    """The nested shapes are built elsewhere (models, fleet, the engine's lines, the bridge's
    state); a key added there and not here would reach the page undeclared."""
    now = timezone.now()
    build = AtlasBuild(pk=1, model_name="m", created=now)
    atlas = Atlas(pk=2, model_name="m", source=Atlas.BUILT, content=b"{}", created=now)
    bridge = BridgeInfo(id="main", host="h", boot="b", model="m", fingerprint="f", context=4096, slots=2, busy=0,
                        queued=0, beat_age_s=0.1234)
    declared = lambda cls: set(cls.__annotations__)  # noqa: E731
    assert set(build.as_dict()) == declared(server_frames.BuildData)
    assert set(atlas.as_dict()) == declared(server_frames.AtlasInfoData)
    assert set(fleet.bridge_entry(bridge)) == declared(server_frames.BridgeEntryData)
    assert set(protocol.Tiers.__dataclass_fields__) == declared(server_frames.TiersData)
    assert set(protocol.Emap.__dataclass_fields__) == declared(server_frames.GridData)
    assert set(protocol.Hits.__dataclass_fields__) == declared(server_frames.GridData)
    assert set(protocol.Repin.__dataclass_fields__) == declared(server_frames.RepinData)

    class Publisher:
        def __init__(self):
            self.turns = []

        def add_turn(self, entry):
            self.turns.append(entry)

    publisher = Publisher()
    EngineTelemetry(publisher).end_turn(protocol.Done(id=1, emitted=9, tok_s=30.5, hit_pct=88.0, rss_gb=1.0,
                                                      prompt_tokens=4, length_limited=False))
    assert set(publisher.turns[0]) == declared(server_frames.TurnData)
    # The snapshot reads these from the bridge's state, which always has them.
    snapshot_state = declared(server_frames.SnapshotFrame) - {"type", "layers", "layer_source", "bridge", "bridges"}
    assert snapshot_state <= set(telemetry.empty_state())
    # A telemetry frame's keys are what the consumer coalesces, plus the layer fields.
    assert set(server_frames.LATEST + server_frames.GATHERED) | set(server_frames.LayerFields.__annotations__) == (
        declared(server_frames.TelemetryFrame) - {"type"})

    frames = [
        server_frames.build(build.as_dict()), server_frames.atlas(atlas.as_dict()),
        server_frames.snapshot(telemetry.empty_state(), {}, "main", [fleet.bridge_entry(bridge)]),
        server_frames.telemetry({"hits": {"rows": 1, "cols": 8, "hex": "01"}, "windows": 1, "turns": publisher.turns},
                                {"layers": [0], "layer_source": "rows"}),
        server_frames.error("bridge", "no live bridge 'x'; live: none"),
    ]
    for frame in frames:
        assert server_frames.problems(frame) == [], frame


def test_the_conformance_check_finds_what_differs():
    ok = server_frames.error("bridge", "no live bridge 'x'; live: main")
    assert server_frames.problems(ok) == []
    assert server_frames.problems({**ok, "code": "unknown_bridge"}) == ["error.code: not declared"]
    assert server_frames.problems({"type": "error", "detail": "no"}) == ["error.field: missing"]
    assert server_frames.problems({"type": "telemetry", "busy": "1"}) == ["telemetry.busy: '1' is not number"]
    assert server_frames.problems({"type": "telemetry", "hits": None}) == [
        "telemetry.hits: None is not an object"]  # telemetry never carries an empty HITS
    assert server_frames.problems({"type": "telemetry", "repin": [{"layer": 1, "expert": 2, "old_tier": 0}]}) == [
        "telemetry.repin[0].gpu: missing"]
    assert server_frames.problems({"type": "telemetry", "turns": [{"hit_pct": 1.0, "tok_s": 2.0,
                                                                   "completion_tokens": True}]}) == [
        "telemetry.turns[0].completion_tokens: True is not number"]
    snapshot = server_frames.snapshot(telemetry.empty_state(), {}, "main", [])
    assert server_frames.problems({**snapshot, "repin": []}) == ["snapshot.repin: not declared"]
    assert server_frames.problems({**snapshot, "bridges": [{"id": "main"}]})[0] == "snapshot.bridges[0].host: missing"
    assert server_frames.problems({"type": "nope"}) == ["unknown frame type 'nope'"]


def test_the_telemetry_frame_has_only_the_keys_that_arrived():
    frame = server_frames.telemetry({"busy": 1, "gpus": []}, {})
    assert frame == {"type": "telemetry", "busy": 1}  # a key the frame does not declare is not sent


def test_the_experts_app_builds_server_frames_only_through_the_funnel():
    """A dict literal whose "type" is a server frame's type, anywhere in experts/ but the funnel, is
    a frame built by hand (the group messages, {"type": "atlas.build"}, are not frames)."""
    assert hand_built_frames(server_frames) == []
