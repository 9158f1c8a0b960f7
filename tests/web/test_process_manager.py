"""`make run`'s process manager (deploy/supervisord.conf, issue 10): a crashed bridge or web
process is restarted and the site answers again, without a person. Runs the real config with the
real processes (Daphne, run_bridge + the native engine on the fixture model, the Celery worker)
on a private port, Redis database and run folder."""
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests.support import procs
from tests.web.live import SERVER_APP, _close_other_sessions, _database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _health(url):
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=3) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except OSError:
        return None, None


def _wait_healthy(url, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = _health(url)
        if status == 200:
            return body
        time.sleep(0.3)
    raise AssertionError(f"/health not 200 within {timeout}s (last: {status} {body})")


@contextlib.contextmanager
def _supervised(engine_binary, tiny_model, tmp_path, django_db_blocker, more_models=()):
    """supervisord with the real config on a private port, Redis database and run folder; the
    bridges of `more_models` written into the run folder as scripts/run.sh writes them."""
    port = procs.free_port()
    redis_url = procs.claim_redis_db()
    with django_db_blocker.unblock():
        database_url = _database_url()
    venv = os.path.dirname(os.path.dirname(procs.PYTHON))
    env = {**os.environ, "ROOT": str(procs.ROOT), "VENV": venv, "PORT": str(port), "RUN_DIR": str(tmp_path),
           "COLIBRI_DEV": "1", "DATABASE_URL": database_url, "REDIS_URL": redis_url,
           "CELERY_BROKER_URL": redis_url, "CACHE_PREFIX": f"test-{uuid.uuid4().hex[:8]}",
           "ENGINE_BINARY": str(engine_binary), "ENGINE_MODEL": str(tiny_model), "KV_SLOTS": "2", "CTX": "512",
           "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "PYTHONUNBUFFERED": "1", "PGAPPNAME": SERVER_APP}
    if more_models:
        subprocess.run(["bash", "-c", 'source scripts/bridges_conf.sh && write_bridges_conf "$@"', "-",
                        str(tmp_path), *map(str, more_models)], cwd=procs.ROOT, check=True)
    log = open(tmp_path / "site.log", "wb")
    proc = subprocess.Popen([f"{venv}/bin/supervisord", "-c", "deploy/supervisord.conf"], cwd=procs.ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    ctl = [f"{venv}/bin/supervisorctl", "-c", str(procs.ROOT / "deploy/supervisord.conf")]
    try:
        yield f"http://127.0.0.1:{port}", proc, ctl, env
    except Exception:
        log.flush()
        print(open(log.name, errors="replace").read()[-4000:])
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        procs.release_redis_db(redis_url)
        with django_db_blocker.unblock():
            _close_other_sessions(SERVER_APP)


@pytest.fixture
def supervised_site(engine_binary, tiny_model, tmp_path, django_db_blocker):
    with _supervised(engine_binary, tiny_model, tmp_path, django_db_blocker) as site:
        yield site


def test_it_restarts_a_crashed_bridge_and_web_process(supervised_site):
    url, proc, ctl, env = supervised_site
    ctl_env = {**os.environ, **env}
    _wait_healthy(url)
    for name in ("bridge", "web"):
        pid = _pid(ctl, ctl_env, name)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _pid(ctl, ctl_env, name) in (0, pid):  # 0: supervisord has not started it again yet
            assert time.monotonic() < deadline, f"{name} was not restarted"
            time.sleep(0.2)
        _wait_healthy(url)
    assert proc.poll() is None, "supervisord itself stopped"


def _pid(ctl, env, name):
    out = subprocess.run([*ctl, "pid", name], capture_output=True, text=True, env=env).stdout.strip()
    return int(out) if out.isdigit() else 0


def test_a_second_model_file_gets_a_bridge_of_its_own(engine_binary, tiny_model, tmp_path, django_db_blocker):
    """ENGINE_MODELS with two files (issue 26 item 5): run.sh's bridges.conf adds a bridge for the
    second, under its own id, and both register in Redis with their own model."""
    import redis

    second = procs.make_tiny_model(tmp_path / "tiny-second.gguf", "--seed", "7")
    with _supervised(engine_binary, tiny_model, tmp_path, django_db_blocker, [second]) as (url, proc, ctl, env):
        _wait_healthy(url)
        client, prefix = redis.Redis.from_url(env["REDIS_URL"]), env["CACHE_PREFIX"]
        deadline, models = time.monotonic() + 60, {}
        while set(models) != {"main", "tiny-second"}:
            assert time.monotonic() < deadline, f"registered: {models}"
            time.sleep(0.3)
            ids = sorted(m.decode() for m in client.smembers(f"{prefix}:bridges"))
            regs = [client.get(f"{prefix}:bridge:{i}:reg") for i in ids]
            models = {i: json.loads(r) for i, r in zip(ids, regs) if r and json.loads(r)["status"] == "up"}
        assert models["tiny-second"]["model"] == "tiny-second" and models["main"]["model"] == tiny_model.stem
        assert _pid(ctl, {**os.environ, **env}, "bridge-tiny-second") > 0
        client.close()
