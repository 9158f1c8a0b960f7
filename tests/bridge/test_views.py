import json

import pytest
import redis
from django.contrib.auth.models import User
from django.test import override_settings

from engine_bridge.liveness import alive_key
from engine_bridge.telemetry import empty_state, get_state, state_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def state(settings):
    client = redis.Redis.from_url(settings.REDIS_URL)

    def put(**fields):
        client.set(state_key(), json.dumps({**empty_state(), **fields, "updated": 1.0}))
        client.set(alive_key(), "boot-1", ex=3)

    yield put
    client.delete(state_key(), alive_key())
    client.close()


@pytest.fixture(autouse=True)
def own_prefix():
    with override_settings(CACHES={"default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache", "KEY_PREFIX": "bridge-views-test"}}):
        yield


def test_it_reports_a_healthy_engine(client, state):
    state(up=True, status="up", model={"name": "tiny"}, slots=2, queue=1, restarts=3)
    r = client.get("/health")
    assert r.status_code == 200, r.json()
    assert r.json() == {"engine": "up", "bridge": "up", "redis": "up", "model": "tiny", "slots": 2, "queue": 1,
                        "restarts": 3, "experts": None, "sampling": {"temperature": 0.7, "top_p": 1.0},
                        "memory": None, "refusal": None, "bridge_id": "main", "bridges": [],
                        "models": []}  # no registration written here


def test_it_reports_a_refused_model_with_the_engines_reason(client, state):
    state(up=False, status="refused", refused="tensor blk.0.ffn_mystery.weight is not known to this engine's "
                                                "qwen3moe loader (unsupported file)")
    r = client.get("/health")
    assert r.status_code == 503 and r["Retry-After"], r.json()
    assert r.json()["engine"] == "refused" and "blk.0.ffn_mystery.weight" in r.json()["refusal"], r.json()


def test_it_reports_the_engines_memory_split(client, state):
    split = {"budget_mb": 3891.2, "source": "cgroup", "dense_mb": 1012.5, "kv_mb": 392.0, "work_mb": 301.7,
             "experts_mb": 2185.0, "prefill_chunk": 1024}
    state(up=True, status="up", model={"name": "moe", "memory": split})
    assert client.get("/health").json()["memory"] == split


def test_it_reports_the_served_models_recommended_sampling(client, state):
    state(up=True, status="up", model={"name": "moe", "sampling": {"temperature": 0.2, "top_p": 0.9, "top_k": 40}})
    assert client.get("/health").json()["sampling"] == {"temperature": 0.2, "top_p": 0.9}
    state(up=True, status="up", model={"name": "moe", "sampling": {"temperature": 9.0}})  # not sendable: ours
    assert client.get("/health").json()["sampling"] == {"temperature": 0.7, "top_p": 1.0}


def test_it_reports_the_per_request_expert_range(client, state):
    state(up=True, status="up", model={"name": "moe", "top_k": 8, "experts_min": 1, "experts_max": 16})
    assert client.get("/health").json()["experts"] == {"default": 8, "min": 1, "max": 16}


def test_it_is_503_while_starting(client, state):
    state(status="starting")
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["engine"] == "starting"


def test_it_is_503_without_a_bridge(client):
    assert get_state()["up"] is False
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["engine"] == "down" and r["Retry-After"]


def test_it_is_503_when_the_bridge_died_but_its_last_state_lingers(client, state, settings):
    state(up=True, status="up", model={"name": "tiny"})
    redis.Redis.from_url(settings.REDIS_URL).delete(alive_key())  # the heartbeat expired
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["bridge"] == "down" and r.json()["engine"] == "down"


def test_it_answers_json_503_while_redis_is_down(client):
    with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):  # nothing listens on port 1
        r = client.get("/health")
    assert r.status_code == 503 and r["Content-Type"] == "application/json"
    assert r.json()["redis"] == "down" and r.json()["engine"] == "unknown"


def test_it_requires_login_for_experts(client, state):
    assert client.get("/experts").status_code == 401


def test_it_serves_the_expert_map(client, state):
    state(up=True, emap={"rows": 2, "cols": 8, "hex": "00" * 16}, hits={"rows": 2, "cols": 8, "hex": "f8fc"},
          seq=4, tiers={"vram_experts": 0}, entropy=[1.5], repin=[])
    client.force_login(User.objects.create_user("alice", is_staff=True))  # staff only (issue 13)
    body = client.get("/experts").json()
    assert body == {"rows": 2, "cols": 8, "map": "00" * 16, "hits": "f8fc", "seq": 4, "gpus": None,
                    "entropy": [1.5], "repin": [], "tiers": {"vram_experts": 0}}


def test_it_is_503_as_soon_as_the_heartbeat_is_stale(client, state, settings):
    """A killed or frozen bridge's alive key lingers up to TTL seconds: its age decides (issue 24)."""
    from engine_bridge import liveness

    state(up=True, status="up", model={"name": "tiny"})
    r = redis.Redis.from_url(settings.REDIS_URL)
    r.set(alive_key(), "boot-1", px=int((liveness.TTL - liveness.STALE_S - 0.3) * 1000))  # last beat 1.8 s ago
    body = client.get("/health")
    assert body.status_code == 503 and body.json()["bridge"] == "down" and body.json()["engine"] == "down"
    r.set(alive_key(), "boot-1", ex=liveness.TTL)  # a fresh beat
    assert client.get("/health").status_code == 200


def test_it_names_a_hung_engine(client, state):
    state(up=True, status="up", model={"name": "tiny"}, hung=True)
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["engine"] == "hung" and r.json()["bridge"] == "up"


def test_it_answers_within_a_second_while_redis_hangs(client):
    """A frozen Redis (SIGSTOP) completes TCP handshakes and never answers: a listening socket
    that is never read stands in for it."""
    import socket
    import time

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(16)
    try:
        with override_settings(REDIS_URL=f"redis://127.0.0.1:{hung.getsockname()[1]}/0"):
            for _ in range(2):  # the second on the pooled client that timed out
                t0 = time.monotonic()
                r = client.get("/health")
                assert time.monotonic() - t0 < 1.0
                assert r.status_code == 503 and r.json()["redis"] == "down"
    finally:
        hung.close()
