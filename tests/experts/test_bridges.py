"""The library follows the page's engine host (issue 26 item 3): with two bridges serving two
models, `?bridge=<id>` (or a POST's `bridge` field) makes the atlas list, experts.json, an
import and a build answer for the model that bridge serves; a bridge that is not live is refused
naming it; no bridge is the default model, as before.

The registry and the telemetry are played by the test (two live registrations and their states),
so engine_bridge.served reads them as it reads real ones."""
import asyncio
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from engine_bridge import registry, telemetry
from engine_bridge.registry import BridgeInfo
from experts import builder, services
from experts.models import Atlas, AtlasBuild

pytestmark = [pytest.mark.django_db]

MODELS = {  # bridge id -> the MODEL facts its telemetry carries
    "host-a": {"id": "tiny-a", "name": "Tiny A", "top_k": 1, "n_experts": 4, "n_layers": 2},
    "host-b": {"id": "tiny-b", "name": "Tiny B", "top_k": 1, "n_experts": 4, "n_layers": 2},
}


def _info(bridge: str) -> BridgeInfo:
    return BridgeInfo(id=bridge, host=f"{bridge}.local", boot=f"boot-{bridge}", model=MODELS[bridge]["id"],
                      fingerprint="1-abc", context=256, slots=2, busy=0, queued=0, beat_age_s=0.1)


def _state(bridge: str | None = None) -> dict:
    state = telemetry.empty_state()
    state.update(up=True, status="up", updated=time.time(), model=MODELS[bridge or "host-a"])
    return state


@pytest.fixture
def two_bridges(monkeypatch, settings):
    settings.DEFAULT_MODEL = ""  # the default model: the first by bridge id (host-a's)
    bridges = [_info(b) for b in MODELS]

    async def abridges_get(max_age_s: float = 0.0) -> list[BridgeInfo]:
        return list(bridges)

    async def aget_state(bridge: str | None = None) -> dict:
        return _state(bridge)

    monkeypatch.setattr(registry, "bridges_get", lambda: list(bridges))
    monkeypatch.setattr(registry, "abridges_get", abridges_get)
    monkeypatch.setattr(telemetry, "get_state", _state)
    monkeypatch.setattr(telemetry, "aget_state", aget_state)


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from channels.layers import channel_layers
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def _upload(sample_bytes: bytes) -> dict:
    return {"file": SimpleUploadedFile("experts.json", sample_bytes)}


@pytest.mark.usefixtures("two_bridges")
def test_it_lists_the_picked_bridges_model_and_its_current_atlas(staff_client, sample_bytes):
    a = services.atlas_import(content=sample_bytes, model_name="Tiny A")
    b = services.atlas_import(content=sample_bytes, model_name="Tiny B")
    body = staff_client.get("/atlas/api/atlases?bridge=host-b").json()
    assert (body["model"], body["model_id"], body["current"]["id"]) == ("Tiny B", "tiny-b", b.pk)
    default = staff_client.get("/atlas/api/atlases").json()  # no bridge: the default model, as before
    assert (default["model"], default["current"]["id"]) == ("Tiny A", a.pk)
    assert staff_client.get("/experts.json?bridge=host-b")["X-Atlas-Id"] == str(b.pk)
    assert staff_client.get("/experts.json")["X-Atlas-Id"] == str(a.pk)


@pytest.mark.usefixtures("two_bridges")
def test_it_imports_under_the_picked_bridges_model(staff_client, sample_bytes):
    by_query = staff_client.post("/atlas/api/atlases?bridge=host-b", _upload(sample_bytes))
    assert by_query.status_code == 201 and by_query.json()["atlas"]["model"] == "Tiny B"
    by_field = staff_client.post("/atlas/api/atlases", {**_upload(sample_bytes), "bridge": "host-b"})
    assert by_field.status_code == 201 and by_field.json()["atlas"]["model"] == "Tiny B"
    default = staff_client.post("/atlas/api/atlases", _upload(sample_bytes))
    assert default.json()["atlas"]["model"] == "Tiny A"
    assert sorted(Atlas.objects.values_list("model_name", flat=True)) == ["Tiny A", "Tiny B", "Tiny B"]


@pytest.mark.usefixtures("two_bridges")
@pytest.mark.parametrize("method, url", [
    ("get", "/atlas/api/atlases?bridge=gone"), ("post", "/atlas/api/atlases?bridge=gone"),
    ("get", "/atlas/api/builds?bridge=gone"), ("post", "/atlas/api/builds?bridge=gone"),
    ("get", "/experts.json?bridge=gone")])
def test_it_refuses_a_bridge_that_is_not_live_naming_it(staff_client, sample_bytes, method, url):
    response = getattr(staff_client, method)(url, _upload(sample_bytes) if method == "post" else None)
    assert response.status_code == 404
    body = response.json()
    assert "'gone'" in body["error"] and "host-a, host-b" in body["error"] and body["field"] == "bridge"
    assert not Atlas.objects.exists() and not AtlasBuild.objects.exists()


@pytest.mark.usefixtures("two_bridges", "in_memory_layer")
def test_it_starts_a_build_for_the_picked_bridges_model_beside_the_default_ones(staff_client):
    default = staff_client.post("/atlas/api/builds").json()["build"]
    assert (default["model"], default["served_model"]) == ("Tiny A", "tiny-a")
    response = staff_client.post("/atlas/api/builds?bridge=host-b")
    assert response.status_code == 202
    build = response.json()["build"]
    assert (build["model"], build["served_model"], build["status"]) == ("Tiny B", "tiny-b", "queued")
    assert build["id"] != default["id"]  # one build per model at a time, not one in all
    assert staff_client.post("/atlas/api/builds", {"bridge": "host-b"}).json()["build"]["id"] == build["id"]
    listed = staff_client.get("/atlas/api/builds?bridge=host-b").json()["builds"]
    assert [b["id"] for b in listed] == [build["id"]]


@pytest.mark.django_db(transaction=True)  # the job's database_sync_to_async closes connections
@pytest.mark.usefixtures("two_bridges", "in_memory_layer")
def test_it_probes_the_picked_bridges_model_and_stores_the_atlas_under_it(monkeypatch):
    asked: list[str | None] = []

    async def probe_generate(request):
        asked.append(request.model)
        seed = sum(request.prompt.encode()) % 4
        counts = [[0, seed, 3], [1, (seed + 1) % 4, 2], [1, 3, 1]]
        return {"reused": 0}, {"kind": "done", "routing": {"rows": 2, "cols": 4, "counts": counts}}

    monkeypatch.setattr(builder, "probe_generate", probe_generate)
    build = services.build_start(model=services.model_served_get(bridge="host-b"))
    finished = services.build_run(build_id=build.pk)
    assert finished.status == AtlasBuild.DONE, finished.error
    assert asked and set(asked) == {"tiny-b"}  # every probe routed to a bridge of the second model
    assert finished.atlas is not None and finished.atlas.model_name == "Tiny B"
    assert services.atlas_current(model_name="Tiny A") is None
    assert finished.atlas.categories


@pytest.mark.usefixtures("in_memory_layer")
async def test_the_hits_runner_hears_only_the_bridges_of_its_model():
    """Engines without routes: the telemetry group carries every bridge's items, and another
    model's would read as a gap (a contaminated probe, retried until the build fails)."""
    runner = builder.ProbeRunner(key="k", chunk_words=8, model="tiny-b", bridges=frozenset({"host-b"}))
    pump = asyncio.create_task(runner._pump())
    try:
        for bridge, n in (("host-a", 7), ("host-b", 1), ("host-a", 8), ("host-b", 2)):
            await runner.layer.send(runner.channel, {"type": "telemetry.batch", "boot": f"boot-{bridge}",
                                                     "bridge": bridge, "items": [{"n": n, "busy": 0}]})
        for _ in range(100):
            if runner.inbox.qsize() >= 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        heard = [runner.inbox.get_nowait() for _ in range(runner.inbox.qsize())]
        assert heard == [("boot-host-b", {"n": 1, "busy": 0}), ("boot-host-b", {"n": 2, "busy": 0})]
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)


@pytest.mark.usefixtures("two_bridges")
def test_it_shows_the_picked_bridges_expert_telemetry(staff_client, monkeypatch):
    def state(bridge: str | None = None) -> dict:
        s = _state(bridge)
        s.update(emap={"rows": 2, "cols": 4, "hex": "01" * 8 if bridge == "host-b" else "00" * 8}, seq=7)
        return s

    monkeypatch.setattr(telemetry, "get_state", state)
    picked, default = staff_client.get("/experts?bridge=host-b").json(), staff_client.get("/experts").json()
    assert (picked["map"], picked["rows"], picked["cols"]) == ("01" * 8, 2, 4)
    assert default["map"] == "00" * 8  # no bridge: the default one (host-a), as before
    gone = staff_client.get("/experts?bridge=gone")
    assert gone.status_code == 404 and "'gone'" in gone.json()["error"] and gone.json()["field"] == "bridge"


def test_its_expert_telemetry_is_a_503_while_redis_is_out(staff_client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: a real refused connection
    response = staff_client.get("/experts")
    assert response.status_code == 503 and response["Retry-After"] == "2"
    assert "Redis" in response.json()["error"] and "rows" not in response.json()
