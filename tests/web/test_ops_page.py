"""The operator's page (/ops) and its figures (/ops/stats.json): staff only — anonymous to the
login page (JSON: 401), members 403 — and the JSON is /v1/stats' (same registry, same keys).
In a browser, live: tests/browser/test_ops_live.py."""
import pytest
from django.test import Client

from tests.web.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)


@pytest.fixture(autouse=True)
def bridge_state(monkeypatch):
    state = {"status": "up", "up": True, "updated": 1.0, "model": {"name": "tiny"}, "slots": 2, "busy": 1,
             "queue": 0, "restarts": 0}
    monkeypatch.setattr("engine_bridge.telemetry.get_state", lambda bridge=None: state)


def client_for(user):
    c = Client()
    if user is not None:
        c.force_login(user)
    return c


def test_anonymous_goes_to_the_login_page_and_the_json_says_401():
    r = Client().get("/ops")
    assert r.status_code == 302 and r["Location"].startswith("/accounts/login/?next=/ops")
    r = Client().get("/ops/stats.json")
    assert r.status_code == 401 and r.json() == {"error": "login required"}


def test_a_member_gets_403(alice):
    c = client_for(alice)
    assert c.get("/ops").status_code == 403
    assert c.get("/ops/stats.json").status_code == 403


def test_staff_get_the_page_under_the_csp(staff):
    r = client_for(staff).get("/ops")
    assert r.status_code == 200
    html = r.content.decode()
    assert 'src="/static/ops.js"' in html and 'href="/static/ops.css"' in html
    assert 'id="ops-boot" type="application/json"' in html
    # No inline script or style: only the JSON data block, whose type the browser never runs.
    assert html.count("<script") == 2 and "style=" not in html and "<style" not in html
    assert "script-src 'self'" in r["Content-Security-Policy"]


def test_the_figures_are_those_of_v1_stats(staff, alice_key):
    mine = client_for(staff).get("/ops/stats.json")
    assert mine.status_code == 200 and mine["Cache-Control"].startswith("max-age=0")
    data = mine.json()
    public = Client().get("/v1/stats", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()
    assert set(data) == set(public) | {"time"}
    assert data["engine"] == public["engine"] == {"up": 1, "slots": 2, "busy": 1, "queue": 0, "restarts": 0}
    assert set(data["metrics"]) == set(public["metrics"])
    assert "colibri_api_expert_hit_percent" in data["metrics"] and "colibri_api_prefix_reuse_tokens" in data["metrics"]


def test_staff_see_the_link_in_the_navigation(staff, alice):
    assert 'href="/ops"' in client_for(staff).get("/").content.decode()
    assert 'href="/ops"' not in client_for(alice).get("/").content.decode()


def test_the_last_turns_expert_io_is_in_v1_stats_ops_and_metrics(staff, alice_key, monkeypatch):
    from engine_bridge import protocol

    io = protocol.IoStat(7, 20, 4000000, 1000000, 150, 200, 0.25, 40, 30).figures()
    state = {"status": "up", "up": True, "updated": 1.0, "slots": 2, "busy": 0, "queue": 0, "restarts": 0, "iostat": io}
    monkeypatch.setattr("engine_bridge.telemetry.get_state", lambda bridge=None: state)
    public = Client().get("/v1/stats", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()
    assert public["io"] == client_for(staff).get("/ops/stats.json").json()["io"] == io
    assert (io["disk_bytes_per_token"], io["ideal_bytes_per_token"], io["hit_pct"], io["stall_ms_per_token"],
            io["prefetch_accuracy_pct"]) == (200000.0, 50000.0, 75.0, 12.5, 75.0)
    text = client_for(staff).get("/metrics").content.decode()
    assert "colibri_engine_last_turn_disk_bytes 4e+06" in text and "colibri_engine_last_turn_stall_seconds 0.25" in text


def test_an_engine_without_iostat_leaves_io_null(staff):
    assert client_for(staff).get("/ops/stats.json").json()["io"] is None


def test_the_engines_memory_split_is_in_v1_stats_and_ops(staff, alice_key, monkeypatch):
    split = {"budget_mb": 3891.2, "source": "cgroup", "limit_mb": 4096.0, "margin_mb": 204.8, "dense_mb": 1012.4,
             "kv_mb": 392.0, "work_mb": 301.7, "experts_mb": 2185.0, "experts_all_mb": 16800.0,
             "experts_resident": False, "expert_override": False, "prefill_rows": 4096, "prefill_chunk": 1024}
    state = {"status": "up", "up": True, "updated": 1.0, "slots": 2, "busy": 0, "queue": 0, "restarts": 0,
             "model": {"name": "moe", "memory": split}}
    monkeypatch.setattr("engine_bridge.telemetry.get_state", lambda bridge=None: state)
    public = Client().get("/v1/stats", HTTP_AUTHORIZATION=f"Bearer {alice_key}").json()
    assert public["memory"] == client_for(staff).get("/ops/stats.json").json()["memory"] == split
    state["model"] = {"name": "another engine"}     # no MODEL memory: null
    assert client_for(staff).get("/ops/stats.json").json()["memory"] is None


def test_the_slots_memory_is_in_ops_stats(staff, monkeypatch):
    """SLOTMEM figures by slot (engine_bridge.telemetry_events.slotmem) travel to /ops/stats.json."""
    slots = {"0": {"kv_bytes": 131584, "state_bytes": 84480, "checkpoints": 4, "total_bytes": 216064}}
    state = {"status": "up", "up": True, "updated": 1.0, "slots": 2, "busy": 0, "queue": 0, "restarts": 0,
             "model": {"name": "moe"}, "slot_memory": slots}
    monkeypatch.setattr("engine_bridge.telemetry.get_state", lambda bridge=None: state)
    assert client_for(staff).get("/ops/stats.json").json()["slot_memory"] == slots
    state["slot_memory"] = None
    assert client_for(staff).get("/ops/stats.json").json()["slot_memory"] is None
