"""`live_stack`: the real site for end-to-end tests — Daphne serving colibri_site.asgi and the
bridge worker (manage.py run_bridge) driving the native engine on the fixture model.

Both subprocesses use pytest-django's test database (tests that talk to them need
`transactional_db` so their rows are committed) and a Redis database of their own, so the fixed
bridge channel `engine-bridge` of a developer's running site is never shared.
"""
import contextlib
import json
import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass

import pytest
import redis

from tests.support import procs

READY_TIMEOUT = float(os.environ.get("LIVE_READY_TIMEOUT", "180"))


@dataclass
class LiveStack:
    url: str  # http://127.0.0.1:<port>
    ws_url: str  # ws://127.0.0.1:<port>
    env: dict  # environment of the subprocesses (DATABASE_URL, REDIS_URL, CACHE_PREFIX, ...)
    redis_url: str
    cache_prefix: str
    bridge_pid: int = 0

    def engine_pid(self):
        """The engine process the bridge owns (its child), or None while none runs."""
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # Fields after the parenthesised command name: state, ppid, ...
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.bridge_pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"colibri-engine" in f.read():
                        return int(entry)
        return None

    def bridge_state(self):
        client = redis.Redis.from_url(self.redis_url)
        try:
            raw = client.get(f"{self.cache_prefix}:bridge:main:state")
        finally:
            client.close()
        return json.loads(raw) if raw else {}


def _database_url():
    from django.db import connections

    s = connections["default"].settings_dict
    user, host, port = s.get("USER") or "postgres", s.get("HOST") or "127.0.0.1", s.get("PORT") or 5432
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{host}:{port}/{s['NAME']}"


def _redis_url():
    """A Redis database claimed for this session (tests/support/procs.claim_redis_db): a random
    pick could land on a database another fixture or test session had claimed, and two bridges
    would then share its `engine-bridge` channel."""
    if os.environ.get("LIVE_REDIS_DB"):
        return f"redis://127.0.0.1:6379/{int(os.environ['LIVE_REDIS_DB'])}"
    return procs.claim_redis_db()


def _start_bridge(env, log):
    start = getattr(procs, "start_bridge", None)
    if start is not None:  # the bridge engineer's helper, when it exists
        try:
            return start(env=env, stdout=log)
        except TypeError:
            pass
    return subprocess.Popen([procs.PYTHON, "manage.py", "run_bridge"], cwd=procs.ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_bridge_up(stack, proc, timeout=READY_TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bridge exited with code {proc.returncode}")
        if stack.bridge_state().get("up"):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the bridge did not report up within {timeout}s")


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker, engine_binary, tiny_model, tmp_path_factory):
    with start_stack(django_db_blocker, tmp_path_factory, {"ENGINE_BINARY": str(engine_binary),
                                                           "ENGINE_MODEL": str(tiny_model)}) as stack:
        yield stack


def start_daphne(env: dict, port: int, log) -> subprocess.Popen:
    """Daphne serving colibri_site.asgi on 127.0.0.1:`port` with `env` (its whole environment),
    output to `log`; returned once the port answers."""
    daphne = subprocess.Popen(
        [procs.PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "colibri_site.asgi:application"],
        cwd=procs.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    procs.wait_for_port(port, daphne)
    return daphne


@contextlib.contextmanager
def start_stack(django_db_blocker, tmp_path_factory, engine_env):
    """Daphne + the bridge on the engine `engine_env` names (ENGINE_BINARY and ENGINE_MODEL, or an
    ENGINE_COMMAND such as a fake engine's); its other keys override the defaults below."""
    port = procs.free_port()
    url = f"http://127.0.0.1:{port}"
    with django_db_blocker.unblock():
        database_url = _database_url()
    cache_prefix = f"test-{uuid.uuid4().hex[:8]}"
    redis_url = _redis_url()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "colibri_site.settings",
        "COLIBRI_DEV": "1",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "CACHE_PREFIX": cache_prefix,
        # A long context lets Stop/disconnect tests start generations that outlast the test steps
        # (the fixture model decodes thousands of tokens a second).
        "CTX": os.environ.get("LIVE_CTX", "131072"),
        "KV_SLOTS": "2",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "CSRF_TRUSTED_ORIGINS": url,
        "WEBSOCKET_ALLOWED_ORIGINS": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
        "PGAPPNAME": SERVER_APP,
        **engine_env,
    }
    logdir = tmp_path_factory.mktemp("live")
    stack = LiveStack(url=url, ws_url=f"ws://127.0.0.1:{port}", env=env, redis_url=redis_url, cache_prefix=cache_prefix)
    bridge_log = open(logdir / "bridge.log", "wb")
    daphne_log = open(logdir / "daphne.log", "wb")
    bridge = daphne = None
    try:
        bridge = _start_bridge(env, bridge_log)
        stack.bridge_pid = bridge.pid
        daphne = start_daphne(env, port, daphne_log)
        _wait_bridge_up(stack, bridge)
        yield stack
    except Exception:
        for log in (bridge_log, daphne_log):
            log.flush()
            print(f"--- {log.name} ---\n" + open(log.name, errors="replace").read()[-4000:])
        raise
    finally:
        procs.stop(daphne)
        procs.stop(bridge)
        if not os.environ.get("LIVE_REDIS_DB"):
            procs.release_redis_db(redis_url)
        bridge_log.close()
        daphne_log.close()
        with django_db_blocker.unblock():
            _close_other_sessions(SERVER_APP)


# libpq's application name of every server process a test starts (PGAPPNAME in their env), so
# that stopping them closes their sessions only: a test's own sessions (database_sync_to_async
# threads of a later test in the same run) must survive another stack's teardown.
SERVER_APP = "colibri-test-server"


def _close_other_sessions(application_name: str | None = None) -> None:
    """PostgreSQL may still hold the stopped servers' sessions for a moment; pytest-django could
    then not drop the test database at the end of the run. `application_name`: only the sessions
    of that name (a stopped stack's); None: every other session (the end of the run)."""
    from django.db import OperationalError, connection

    if connection.vendor != "postgresql":
        return
    sql = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    params: list = []
    if application_name is not None:
        sql += " AND application_name = %s"
        params.append(application_name)
    for attempt in range(2):  # this thread's own connection may be one an earlier call terminated
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
            return
        except OperationalError:
            connection.close()
            if attempt:
                raise


@contextlib.contextmanager
def slots_held(stack, model, headers, slots, timeout=300):
    """Keeps every KV slot busy with an endless stream (the fixture model otherwise answers as fast
    as requests arrive) so that new requests queue; yields the Event that lets the holders go
    (set it early to release them inside the block). They are released and joined on exit."""
    import httpx

    holding = [threading.Event() for _ in range(slots)]
    release = threading.Event()

    def holder(i):
        body = {"model": model, "messages": [{"role": "user", "content": f"A very long story, part {i}."}],
                "max_tokens": 100_000, "temperature": 0, "stream": True}
        with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    holding[i].set()
                if release.is_set():
                    break

    holders = [threading.Thread(target=holder, args=(i,)) for i in range(slots)]
    for t in holders:
        t.start()
    try:
        for ev in holding:
            assert ev.wait(60), "the slot holders never started"
        yield release
    finally:
        release.set()
        for t in holders:
            t.join(60)
