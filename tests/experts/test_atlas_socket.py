"""/ws/atlas/: staff only; the bridge's telemetry reaches the page pushed, coalesced per frame.

Every frame these tests receive is held to its declaration in experts/server_frames.py (`receive`):
what the page's generated ServerFrame type says is what the real consumer sends."""
import asyncio

import pytest
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import Client

from engine_bridge import telemetry
from experts import server_frames, services
from experts.consumers import or_hits
from experts.models import AtlasBuild
from experts.routing import websocket_urlpatterns

pytestmark = [pytest.mark.django_db(transaction=True)]
EMAP = {"rows": 2, "cols": 8, "hex": "00000041414344450000434344444342"}


@pytest.fixture
def layer(settings, monkeypatch):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.ENGINE_MODEL = "/models/tiny-moe.gguf"

    async def state(bridge=None):
        return {**telemetry.empty_state(), "up": True, "emap": EMAP, "model": {"name": "tiny", "n_layers": 2},
                "repin": [{"layer": 0, "expert": 1, "old_tier": 1, "gpu": 0}]}

    monkeypatch.setattr(telemetry, "aget_state", state)
    from channels.layers import channel_layers
    channel_layers.backends.clear()


async def connect(user, path="/ws/atlas/"):
    app = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
    client = Client()
    await database_sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    communicator = WebsocketCommunicator(app, path, headers=[(b"cookie", cookie)])
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def receive(ws, timeout=2):
    """The next frame, once it conforms to its declaration (server_frames.problems)."""
    frame = await ws.receive_json_from(timeout=timeout)
    assert server_frames.problems(frame) == [], frame
    return frame


def test_it_ors_hits_bitmaps():
    assert or_hits("", "f8fc") == "f8fc"
    assert or_hits("0100", "0300") == "0300"
    assert or_hits("f000", "000f") == "f00f"


async def test_it_pushes_hits_to_staff_coalesced(layer, staff):
    ws = await connect(staff)
    snapshot = await receive(ws)
    assert snapshot["type"] == "snapshot"
    assert snapshot["emap"] == EMAP
    assert snapshot["layers"] == [0, 1] and snapshot["layer_source"] == "model"
    assert "repin" not in snapshot  # the state's REPINs predate this page: only pushed ones reach it
    publisher = telemetry.Publisher()
    pusher = asyncio.create_task(publisher.push_loop())
    try:
        publisher.update(hits={"rows": 2, "cols": 8, "hex": "0100"}, seq=1)
        publisher.update(hits={"rows": 2, "cols": 8, "hex": "0080"}, seq=2)
        publisher.add_repin({"layer": 1, "expert": 3, "old_tier": 0, "gpu": 0})
        frame = await receive(ws)
    finally:
        pusher.cancel()
        await publisher.client.aclose()
    assert frame["type"] == "telemetry"
    assert frame["hits"]["hex"] == "0180" and frame["windows"] == 2
    assert frame["repin"] == [{"layer": 1, "expert": 3, "old_tier": 0, "gpu": 0}]
    await ws.disconnect()


async def test_it_shows_one_engine_host_and_drops_the_pushes_of_the_others(layer, staff):
    """Several bridges push to the one group: the page shows the bridge it was opened on (the
    default here: "main") and a push of another bridge never reaches it."""
    ws = await connect(staff)
    snapshot = await receive(ws)
    assert snapshot["bridge"] == "main" and snapshot["bridges"] == []  # no bridge registered in this test
    other, own = telemetry.Publisher(bridge="other"), telemetry.Publisher(bridge="main")
    pushers = [asyncio.create_task(p.push_loop()) for p in (other, own)]
    try:
        other.update(hits={"rows": 2, "cols": 8, "hex": "ff00"}, seq=1)
        await asyncio.sleep(0.3)  # the other host's batch has gone out (PUSH_MIN_INTERVAL 0.05 s)
        own.update(hits={"rows": 2, "cols": 8, "hex": "0001"}, seq=1)
        frame = await receive(ws)
    finally:
        for task in pushers:
            task.cancel()
        for p in (other, own):
            await p.client.aclose()
    assert frame["hits"]["hex"] == "0001" and frame["windows"] == 1
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_bridge_that_is_not_live_is_refused_naming_it(layer, staff):
    ws = await connect(staff, "/ws/atlas/?bridge=gone-host")
    error = await receive(ws)
    assert error["type"] == "error" and error["field"] == "bridge" and "'gone-host'" in error["detail"]
    assert await ws.receive_output(timeout=2) == {"type": "websocket.close", "code": 4404}


async def test_it_closes_the_socket_for_members(layer, member):
    ws = await connect(member)
    closed = await ws.receive_output(timeout=2)
    assert closed == {"type": "websocket.close", "code": 4403}


async def test_it_forwards_finished_turns_figures_when_the_bridge_sends_them(layer, staff):
    """A `turn` item (a finished turn's DONE figures) reaches the page in order, in `turns`."""
    from channels.layers import get_channel_layer

    ws = await connect(staff)
    await receive(ws)  # the snapshot
    turns = [{"hit_pct": 87.5, "tok_s": 31.2, "completion_tokens": 40}, {"hit_pct": 90.0, "tok_s": 30.8, "completion_tokens": 12}]
    items = [{"n": 1, "turn": turns[0]}, {"n": 2, "busy": 0}, {"n": 3, "turn": turns[1]}]
    await get_channel_layer().group_send(telemetry.GROUP, {"type": "telemetry.batch", "boot": "b", "items": items})
    frame = await receive(ws)
    assert frame["turns"] == turns and frame["busy"] == 0
    await ws.disconnect()


async def test_an_open_atlas_socket_closes_when_its_session_ends_or_staff_is_revoked(layer, staff, django_user_model):
    """Issue 24: no signal needed (a queryset update(), a deleted session)."""
    from django.contrib.sessions.models import Session

    from colibri_base.socket_access import CHECK_S

    ws = await connect(staff)
    assert (await receive(ws))["type"] == "snapshot"
    await database_sync_to_async(Session.objects.all().delete)()
    assert await ws.receive_output(timeout=CHECK_S + 3) == {"type": "websocket.close", "code": 4401}
    ws = await connect(staff)
    assert (await receive(ws))["type"] == "snapshot"
    await database_sync_to_async(django_user_model.objects.filter(pk=staff.pk).update)(is_staff=False)
    assert await ws.receive_output(timeout=CHECK_S + 3) == {"type": "websocket.close", "code": 4401}


async def test_a_builds_progress_and_a_saved_atlas_reach_the_page(layer, staff, sample_bytes):
    """The group's `atlas.build` (experts.services.build_publish) and `atlas.saved` messages
    become the page's `build` and `atlas` frames, carrying the rows' dicts whole."""
    from channels.layers import get_channel_layer

    ws = await connect(staff)
    await receive(ws)  # the snapshot
    build = await AtlasBuild.objects.acreate(model_name="tiny-moe", served_model="tiny-moe", total=8, done=3)
    await database_sync_to_async(services.build_publish)(build=build)
    frame = await receive(ws)
    assert frame == {"type": "build", "build": build.as_dict()}
    atlas = await database_sync_to_async(services.atlas_import)(content=sample_bytes, model_name="tiny-moe")
    await get_channel_layer().group_send(services.BUILD_GROUP, {"type": "atlas.saved", "atlas": atlas.as_dict()})
    frame = await receive(ws)
    assert frame["type"] == "atlas" and frame["atlas"]["id"] == atlas.pk
    assert set(frame["atlas"]) == set(server_frames.AtlasInfoData.__annotations__)
    await ws.disconnect()
