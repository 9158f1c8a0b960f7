"""Engine not there (issue 10 item 5, issue 12 item 4): a live Daphne whose bridge is not running,
then one whose engine cannot start (missing model). Every /v1 surface answers promptly with 503
(Anthropic: 529 overloaded_error) and Retry-After in its envelope, never 404 model_not_found and
never a long wait."""
import os
import subprocess
import time
import uuid

import httpx
import pytest

from api.models import ApiKey
from tests.support import procs
from tests.web.live import _database_url

pytestmark = pytest.mark.django_db(transaction=True)
BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    "/v1/responses": {"input": "hi"},
}


@pytest.fixture
def site(tmp_path, engine_binary):
    """Daphne on a private Redis database; the test decides whether a bridge runs."""
    redis_url = procs.claim_redis_db()
    port = procs.free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "colibri_site.settings", "COLIBRI_DEV": "1",
           "DATABASE_URL": _database_url(), "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
           "CACHE_PREFIX": f"test-{uuid.uuid4().hex[:8]}", "ALLOWED_HOSTS": "127.0.0.1",
           "ENGINE_BINARY": str(engine_binary), "ENGINE_MODEL": str(tmp_path / "missing-model.gguf"),
           "KV_SLOTS": "1", "CTX": "256", "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "PYTHONUNBUFFERED": "1"}
    log = open(tmp_path / "daphne.log", "wb")
    procs_started = []
    daphne = subprocess.Popen([procs.PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "colibri_site.asgi:application"], cwd=procs.ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    procs_started.append(daphne)
    try:
        procs.wait_for_port(port, daphne)
        yield {"url": f"http://127.0.0.1:{port}", "env": env, "procs": procs_started, "tmp": tmp_path}
    finally:
        for p in reversed(procs_started):
            procs.stop(p)
        log.close()
        procs.release_redis_db(redis_url)


def _check_all_surfaces(site, key, limit_s):
    for route, body in BODIES.items():
        t0 = time.monotonic()
        # A model name the site cannot know yet (no MODEL line has arrived).
        r = httpx.post(site["url"] + route, json={"model": "whatever-it-will-be", **body}, timeout=30,
                       headers={"Authorization": f"Bearer {key}"})
        took = time.monotonic() - t0
        assert took < limit_s, (route, took)
        assert int(r.headers["retry-after"]) >= 1, route
        if route == "/v1/messages":
            assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error", r.text
        else:
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
        # The typeable id from the settings goes on to the bridge side: 503 all the same.
        r = httpx.post(site["url"] + route, json={"model": "missing", **body}, timeout=30,
                       headers={"Authorization": f"Bearer {key}"})
        assert r.status_code in (503, 529) and "partial reply" not in r.text, (route, r.text)


def test_no_bridge_running_is_a_prompt_503(site, alice):
    key = ApiKey.issue(user=alice, name="down")[1]
    _check_all_surfaces(site, key, limit_s=3)


def test_an_engine_that_cannot_start_is_a_prompt_503(site, alice):
    key = ApiKey.issue(user=alice, name="unstartable")[1]
    log = open(site["tmp"] / "bridge.log", "wb")
    env = {**site["env"], "ENGINE_BINARY": str(site["tmp"] / "no-such-engine")}
    bridge = subprocess.Popen([procs.PYTHON, "manage.py", "run_bridge"], cwd=procs.ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    site["procs"].append(bridge)
    deadline = time.monotonic() + 30
    while not procs.bridge_state(site["env"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert procs.bridge_state(site["env"]), "the bridge never published its state"
    _check_all_surfaces(site, key, limit_s=5)
