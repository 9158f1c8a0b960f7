"""Issue 24: what a crash leaves behind, on a stack of this module's own (a private redis-server,
Daphne, the bridge and the engine on the fixture model), so that killing or freezing any part
disturbs no other test. Each fault asserts its outcome and prints its figures:

* /health turns 503 naming the part soon after the bridge, the engine or Redis is killed or
  frozen, answering within a second meanwhile, and 200 again after;
* Daphne killed -9 under 2 websocket turns and 2 API streams: the bridge frees their slots within
  seconds, and the restarted web process's sweep marks the cut-off replies `interrupted` with
  their partial text;
* a websocket turn rides out a 3 s Redis kill, and one sent during it is answered; no frame a user
  reads names a host, a port or an exception;
* a bulk revocation (queryset update(), no signal) refuses the key within a second;
* an open socket whose session expires is closed (4401).
"""
import asyncio
import json
import os
import signal
import subprocess
import threading
import time
import uuid

import httpx
import pytest
import redis
import websockets
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from api.models import ApiKey
from chat.models import Message
from tests.support import procs
from tests.web.live import _database_url

pytestmark = pytest.mark.django_db(transaction=True)
LONG = 100_000  # tokens: outlasts every step (the fixture model decodes thousands a second)
# Greedy on the fixture model under ChatML this runs 50,000+ characters; "a long story" ends by
# itself after 3,942 (so did the API streams of this test's first version, unnoticed).
LONG_PROMPT = "tell me story 1"
INTERNAL = ("127.0.0.1", "Error ", "Errno", "Traceback", "redis://", "6379", "Connect call")


class FaultStack:
    """Daphne + bridge on a private Redis, each restartable after a kill."""

    def __init__(self, tmp, engine_binary, tiny_model, database_url):
        self.tmp = tmp
        self.redis_port, self.port = procs.free_port(), procs.free_port()
        self.url, self.ws_url = f"http://127.0.0.1:{self.port}", f"ws://127.0.0.1:{self.port}"
        redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.prefix = f"faults-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "colibri_site.settings", "COLIBRI_DEV": "1",
                    "DATABASE_URL": database_url, "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
                    "CACHE_PREFIX": self.prefix, "ENGINE_BINARY": str(engine_binary),
                    "ENGINE_MODEL": str(tiny_model), "CTX": "131072", "KV_SLOTS": "4",
                    "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "ALLOWED_HOSTS": "127.0.0.1,localhost",
                    "CSRF_TRUSTED_ORIGINS": self.url, "WEBSOCKET_ALLOWED_ORIGINS": "127.0.0.1,localhost",
                    "CHAT_AUTO_TITLE": "0", "PYTHONUNBUFFERED": "1"}
        self.redis = self.daphne = self.bridge = None
        self.logs = []

    def _log(self, name):
        log = open(self.tmp / f"{name}-{len(self.logs)}.log", "wb")
        self.logs.append(log)
        return log

    def start_redis(self):
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)], stdout=subprocess.DEVNULL)
        procs.wait_for_port(self.redis_port, self.redis)

    def start_daphne(self):
        self.daphne = subprocess.Popen(
            [procs.PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "colibri_site.asgi:application"],
            cwd=procs.ROOT, env=self.env, stdout=self._log("daphne"), stderr=subprocess.STDOUT)
        procs.wait_for_port(self.port, self.daphne, timeout=60)

    def start_bridge(self):
        before = self.state().get("updated")  # a killed bridge's state lingers (TTL 15 s)
        self.bridge = subprocess.Popen([procs.PYTHON, "manage.py", "run_bridge"], cwd=procs.ROOT, env=self.env,
                                       stdout=self._log("bridge"), stderr=subprocess.STDOUT)
        wait_until(lambda: (st := self.state()).get("up") and st.get("updated") != before and
                   st.get("restarts") == 0 and self.engine_pid(), 120, "the bridge's engine up")

    def client(self):
        return redis.Redis.from_url(self.env["REDIS_URL"], socket_timeout=2)

    def state(self):
        try:
            raw = self.client().get(f"{self.prefix}:bridge:main:state")
        except redis.RedisError:
            return {}
        return json.loads(raw) if raw else {}

    def engine_pid(self):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError):
                    continue
                if ppid == self.bridge.pid:
                    return int(entry)
        return None

    def health(self):
        """(status, body, seconds the answer took)."""
        t0 = time.monotonic()
        try:
            r = httpx.get(self.url + "/health", timeout=10)
            return r.status_code, r.json(), time.monotonic() - t0
        except httpx.HTTPError as exc:
            return None, {"error": repr(exc)}, time.monotonic() - t0

    def stop(self):
        for proc in (self.daphne, self.bridge, self.redis):
            if proc is not None:
                with_signal(proc.pid, signal.SIGCONT)
                procs.stop(proc)
        for log in self.logs:
            log.close()

    def dump_logs(self):
        for log in self.logs:
            log.flush()
            print(f"--- {log.name} ---\n" + open(log.name, errors="replace").read()[-3000:])


def with_signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def close_loop(loop):
    """Ends what the sockets left on a test's own loop (their keepalive tasks), then the loop."""
    async def cancel_the_rest():
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    loop.run_until_complete(cancel_the_rest())
    loop.close()


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, engine_binary, tiny_model, tmp_path_factory):
    with django_db_blocker.unblock():
        database_url = _database_url()
    s = FaultStack(tmp_path_factory.mktemp("faults"), engine_binary, tiny_model, database_url)
    failed = True
    try:
        s.start_redis()
        s.start_bridge()
        s.start_daphne()
        wait_until(lambda: s.health()[0] == 200, 60, "/health 200")
        yield s
        failed = False
    finally:
        if failed:
            s.dump_logs()
        s.stop()


@pytest.fixture
def cookie(alice):
    c = Client()
    c.force_login(alice)
    return c.cookies["sessionid"].value


def healthy(stack, timeout=60):
    wait_until(lambda: stack.health()[0] == 200, timeout, "/health 200 again")


def time_to_503(stack, part, expected, timeout=20):
    """Seconds until /health says `part` is `expected` (503), and the slowest answer meanwhile."""
    t0, slowest = time.monotonic(), 0.0
    while True:
        status, body, took = stack.health()
        slowest = max(slowest, took)
        if status == 503 and body.get(part) == expected:
            return time.monotonic() - t0, slowest
        assert time.monotonic() - t0 < timeout, f"/health still {status} {body} after {timeout}s"
        time.sleep(0.05)


def test_health_names_each_failing_part_within_seconds_and_answers_within_one(stack):
    figures = {}
    healthy(stack)

    def fault(name, part, expected, do, undo):
        do()
        try:
            figures[name] = time_to_503(stack, part, expected)
            # still answering within a second a little later (a fault that lasts)
            time.sleep(0.5)
            status, body, took = stack.health()
            assert status == 503 and body.get(part) == expected and took < 1.0, (name, status, body, took)
            figures[name] = (figures[name][0], max(figures[name][1], took))
        finally:
            undo()
        healthy(stack)

    fault("engine SIGSTOP", "engine", "hung", lambda: with_signal(stack.engine_pid(), signal.SIGSTOP),
          lambda: with_signal(stack.engine_pid(), signal.SIGCONT))
    fault("bridge SIGSTOP", "bridge", "down", lambda: with_signal(stack.bridge.pid, signal.SIGSTOP),
          lambda: with_signal(stack.bridge.pid, signal.SIGCONT))
    fault("Redis SIGSTOP", "redis", "down", lambda: with_signal(stack.redis.pid, signal.SIGSTOP),
          lambda: with_signal(stack.redis.pid, signal.SIGCONT))
    fault("Redis killed", "redis", "down", lambda: (stack.redis.kill(), stack.redis.wait()), stack.start_redis)
    fault("bridge killed", "bridge", "down", lambda: (stack.bridge.kill(), stack.bridge.wait()), stack.start_bridge)
    print("\n/health after each fault (seconds to 503, slowest answer):")
    for name, (to_503, slowest) in figures.items():
        print(f"  {name}: {to_503:.2f} s, {slowest:.2f} s")
    for name, (to_503, slowest) in figures.items():
        assert slowest < 1.0, (name, slowest)
        assert to_503 < 5.0, (name, to_503)  # the bridge's beat is judged stale after 1.5 s


async def _ws_turn(stack, cookie, text, max_tokens):
    ws = await websockets.connect(stack.ws_url + "/ws/chat/", origin=stack.url,
                                  additional_headers={"Cookie": f"sessionid={cookie}"}, open_timeout=20)
    await ws.send(json.dumps({"type": "send", "conversation": None, "text": text,
                              "params": {"max_tokens": max_tokens, "temperature": 0}}))
    return ws


async def _until(ws, kind, timeout=60, seen=None):
    deadline = time.monotonic() + timeout
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic())))
        if seen is not None:
            seen.append(frame)
        if frame["type"] == kind:
            return frame


def _api_stream(stack, key, model, started, stop):
    """An API stream held open until `stop` (or until Daphne dies under it)."""
    body = {"model": model, "messages": [{"role": "user", "content": LONG_PROMPT}],
            "max_tokens": LONG, "stream": True, "temperature": 0}
    try:
        with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {key}"}) as r:
            for _ in r.iter_lines():
                started.set()
                if stop.is_set():
                    return
    except httpx.HTTPError:
        pass


def test_killing_daphne_under_live_streams_frees_its_slots_and_its_replies_are_swept(stack, cookie, alice):
    healthy(stack)
    key = ApiKey.issue(user=alice, name="faults")[1]
    model = httpx.get(stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
    started = [threading.Event(), threading.Event()]
    stop = threading.Event()
    threads = []
    for event in started:
        t = threading.Thread(target=_api_stream, args=(stack, key, model, event, stop), daemon=True)
        t.start()
        threads.append(t)

    async def two_turns():
        sockets, ids = [], []
        for _ in range(2):  # greedy on the fixture model, this prompt runs 5,000+ tokens (some end at once)
            ws = await _ws_turn(stack, cookie, LONG_PROMPT, LONG)
            ids.append((await _until(ws, "delta"))["message"])
            sockets.append(ws)
        return sockets, ids

    loop = asyncio.new_event_loop()
    try:
        _, message_ids = loop.run_until_complete(two_turns())
        for event in started:
            assert event.wait(30), "an API stream did not start"
        wait_until(lambda: stack.state().get("busy") == 4, 20, "4 busy slots")
        time.sleep(1.0)  # a partial save of the replies (every 0.5 s)
        assert stack.state().get("busy") == 4, "a stream ended by itself: the kill would prove nothing"
        stack.daphne.kill()
        t_kill = time.monotonic()
        stack.daphne.wait()
        wait_until(lambda: stack.state().get("busy") == 0, 30, "the dead web process's slots to free")
        freed = time.monotonic() - t_kill
    finally:
        stop.set()
        close_loop(loop)
    assert freed < 10, f"orphaned slots freed after {freed:.1f}s"
    assert all(m.status == "streaming" for m in Message.objects.filter(pk__in=message_ids))
    stack.start_daphne()
    t_restart = time.monotonic()

    def swept():
        rows = list(Message.objects.filter(pk__in=message_ids))
        return all(m.status != "streaming" for m in rows) and rows
    rows = wait_until(swept, 30, "the sweep of the cut-off replies")
    sweep = time.monotonic() - t_restart
    print(f"\nDaphne kill -9 under 2 ws turns + 2 API streams ({model}): slots free after {freed:.1f} s; "
          f"replies swept {sweep:.1f} s after the restart ({time.monotonic() - t_kill:.1f} s after the kill)")
    for m in rows:
        assert m.status == "interrupted" and m.text, (m.pk, m.status, m.text[:40])
    healthy(stack)


def test_a_websocket_turn_rides_out_a_redis_outage(stack, cookie):
    healthy(stack)

    async def run():
        seen = []
        ws = await _ws_turn(stack, cookie, LONG_PROMPT, LONG)
        conv = (await _until(ws, "conversation", seen=seen))["conversation"]["id"]
        await _until(ws, "delta", seen=seen)
        stack.redis.kill()
        stack.redis.wait()
        await asyncio.sleep(3)
        stack.start_redis()
        # the turn in flight goes on: more text after the outage (or its end), then Stop ends it
        count, t0 = sum(f["type"] == "delta" for f in seen), time.monotonic()
        while sum(f["type"] == "delta" for f in seen) < count + 3 and not any(f["type"] == "done" for f in seen):
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            seen.append(frame)
            assert frame["type"] != "error", frame
        resumed = time.monotonic() - t0
        if not any(f["type"] == "done" for f in seen):
            await ws.send(json.dumps({"type": "stop", "conversation": conv}))
            await _until(ws, "done", timeout=30, seen=seen)
        done = next(f for f in seen if f["type"] == "done")
        assert done["message"]["status"] in ("interrupted", "complete") and done["message"]["text"], done
        # a turn sent while Redis is out is answered once it is back (the submit is retried)
        stack.redis.kill()
        stack.redis.wait()
        await ws.send(json.dumps({"type": "send", "conversation": None, "text": "hello", "params": {"max_tokens": 4}}))
        await asyncio.sleep(2)
        stack.start_redis()
        t1 = time.monotonic()
        done2 = await _until(ws, "done", timeout=60, seen=seen)
        answered = time.monotonic() - t1
        assert done2["message"]["status"] == "complete", done2
        await ws.close()
        return seen, resumed, answered

    seen, resumed, answered = asyncio.run(run())
    errors = [f for f in seen if f["type"] == "error"]
    assert not errors, errors
    text = json.dumps(seen)
    assert not any(marker in text for marker in INTERNAL), [m for m in INTERNAL if m in text]
    print(f"\nwebsocket turn across a 3 s Redis kill: text again {resumed:.1f} s after Redis returned; "
          f"a turn sent during a 2 s kill answered {answered:.1f} s after Redis returned")
    healthy(stack)


def test_a_bulk_revocation_takes_effect_within_a_second(stack, alice):
    healthy(stack)
    row, key = ApiKey.issue(user=alice, name="bulk")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=10) as http:
        warm = http.get("/v1/models")  # the key is cached in the web process now
        assert warm.status_code == 200, (warm.status_code, warm.text[:200])
        ApiKey.objects.filter(pk=row.pk).update(revoked=True)  # no signal, as an admin action
        t0 = time.monotonic()
        answers = []  # (seconds after the update when the request left, status)
        while time.monotonic() - t0 < 2:
            sent = time.monotonic() - t0  # when the request left: the answer may come later on a busy host
            answers.append((round(sent, 2), http.get("/v1/models").status_code))
            time.sleep(0.05)
    late = [sent for sent, status in answers if status == 200]
    print(f"\nbulk revocation: {len(late)} requests accepted after it, the last sent {max(late, default=0):.2f} s after")
    assert not late or max(late) < 1.2, answers
    assert {status for sent, status in answers if sent >= 1.2} <= {401}, answers
    assert http_refuses(stack, headers)


def http_refuses(stack, headers):
    return httpx.get(stack.url + "/v1/models", headers=headers, timeout=10).status_code == 401


def test_an_open_socket_closes_when_its_session_expires(stack, cookie):
    healthy(stack)
    loop = asyncio.new_event_loop()  # steps on it; the ORM runs between them, off the loop

    async def open_socket():
        ws = await websockets.connect(stack.ws_url + "/ws/chat/", origin=stack.url,
                                      additional_headers={"Cookie": f"sessionid={cookie}"}, open_timeout=20)
        await ws.send(json.dumps({"type": "open", "conversation": 2 ** 62}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["code"] == "not_found"
        return ws

    async def closed(ws):
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed as exc:
            return exc

    try:
        ws = loop.run_until_complete(open_socket())
        Session.objects.filter(session_key=cookie).update(expire_date=timezone.now())
        t0 = time.monotonic()
        exc = loop.run_until_complete(closed(ws))
        after = time.monotonic() - t0
    finally:
        close_loop(loop)
    assert exc.rcvd is not None and exc.rcvd.code == 4401, exc
    print(f"\nsession expired on an open socket: closed 4401 after {after:.2f} s")
    assert after < 5


# Redis out under new API requests (api.outage): each surface answers its own 503 (Messages: 529
# overloaded_error) with Retry-After once the request's ride-out window is spent, never a 500;
# a request whose outage ends within the window is served; the key check needs no Redis.
SURFACE_CALLS = {  # surface -> (path, body, headers besides the key, its busy status)
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
             {}, 503),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
                 {"anthropic-version": "2023-06-01"}, 529),
}


def _api_call(stack, key, surface, model, stream=False, timeout=40):
    """(status, headers, body or the stream's text, seconds): one request, buffered or streamed."""
    path, body, headers, _ = SURFACE_CALLS[surface]
    headers = {**headers, "Authorization": f"Bearer {key}"} if surface == "chat" else {**headers, "x-api-key": key}
    t0 = time.monotonic()
    with httpx.stream("POST", stack.url + path, json={**body, "model": model, "stream": stream, "temperature": 0},
                      headers=headers, timeout=timeout) as r:
        text = r.read().decode()
    try:
        payload = json.loads(text)
    except ValueError:
        payload = text
    return r.status_code, r.headers, payload, time.monotonic() - t0


def _in_threads(calls):
    """Runs each () -> result at once in a thread of its own; -> their results, in order."""
    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - reported by the assertions
            results[i] = exc
    threads = [threading.Thread(target=run, args=(i, c), daemon=True) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _limited_key(alice, name):
    row, key = ApiKey.issue(user=alice, name=name)
    # limits on the key: its admission runs both rate-limit scripts in Redis
    ApiKey.objects.filter(pk=row.pk).update(requests_per_minute=10_000, tokens_per_minute=10_000_000)
    return key


def _model(stack, key):
    return httpx.get(stack.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]


def _kill_redis(stack):
    stack.redis.kill()
    stack.redis.wait()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_new_api_requests_in_a_long_redis_outage_get_their_surfaces_503_with_retry_after(stack, alice, fault):
    from engine_bridge.client import BROKER_OUTAGE_S

    healthy(stack)
    warm, fresh = _limited_key(alice, "warm"), ApiKey.issue(user=alice, name="fresh")[1]
    model = _model(stack, warm)
    assert _api_call(stack, warm, "chat", model)[0] == 200
    calls = [(key, surface, stream) for key in (warm, fresh) for surface in SURFACE_CALLS for stream in (False, True)]
    if fault == "killed":
        _kill_redis(stack)
    else:  # SIGSTOP: connections open, nothing answers
        with_signal(stack.redis.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        results = _in_threads([lambda c=c: _api_call(stack, c[0], c[1], model, stream=c[2]) for c in calls] + [
            lambda: _api_call(stack, "sk-colibri-not-a-key", "chat", model),
            lambda: httpx.get(stack.url + "/v1/models", headers={"Authorization": f"Bearer {warm}"}, timeout=10)])
        outage = time.monotonic() - t0
    finally:
        if fault == "killed":
            stack.start_redis()
        else:
            with_signal(stack.redis.pid, signal.SIGCONT)
    *answers, bogus, models = results
    print(f"\n{len(calls)} new API requests in a {outage:.1f} s Redis outage, {fault} "
          f"(ride-out window {BROKER_OUTAGE_S:g} s):")
    for (key, surface, stream), answer in zip(calls, answers):
        assert not isinstance(answer, Exception), (surface, stream, answer)
        status, headers, body, took = answer
        print(f"  {surface:8} {'stream' if stream else 'buffered':8} {'warm' if key == warm else 'fresh'} key: "
              f"{status} Retry-After {headers.get('retry-after')} after {took:.1f} s")
        assert status == SURFACE_CALLS[surface][3], (surface, stream, status, body)
        assert int(headers["retry-after"]) >= 1 and int(headers["retry-after-ms"]) >= 1000, dict(headers)
        if surface == "chat":
            assert body["error"]["type"] == "server_error" and body["error"]["code"] == "service_unavailable", body
            assert set(body["error"]) >= {"message", "type", "param", "code"}, body
        else:
            assert body == {"type": "error", "error": {"type": "overloaded_error", "message": body["error"]["message"]}}
        assert not any(marker in json.dumps(body) for marker in INTERNAL), body
        # rode out for the window (from the view's start), then said so; a frozen Redis no longer
        assert BROKER_OUTAGE_S - 1 <= took <= BROKER_OUTAGE_S + 4, (surface, stream, took)
    assert bogus[0] == 401, bogus  # the key check reads the database: a bad key is still a 401
    assert models.status_code == 200 and models.json()["data"], (models.status_code, models.text[:200])
    healthy(stack)
    assert _api_call(stack, warm, "messages", model)[0] == 200


def test_a_new_api_request_rides_out_a_short_redis_outage(stack, alice):
    healthy(stack)
    warm, fresh = _limited_key(alice, "warm"), ApiKey.issue(user=alice, name="fresh")[1]
    model = _model(stack, warm)
    assert _api_call(stack, warm, "chat", model)[0] == 200
    calls = [(key, surface, stream) for key in (warm, fresh) for surface in SURFACE_CALLS for stream in (False, True)]
    _kill_redis(stack)
    back = []

    def restart_after(seconds):
        time.sleep(seconds)
        stack.start_redis()
        back.append(time.monotonic())
        return None
    t0 = time.monotonic()
    results = _in_threads([lambda c=c: _api_call(stack, c[0], c[1], model, stream=c[2]) for c in calls]
                          + [lambda: restart_after(2.0)])
    assert back, "Redis did not restart"
    print(f"\n{len(calls)} new API requests sent into a Redis outage that ended {back[0] - t0:.1f} s later:")
    for (key, surface, stream), answer in zip(calls, results):
        assert not isinstance(answer, Exception), (surface, stream, answer)
        status, headers, body, took = answer
        print(f"  {surface:8} {'stream' if stream else 'buffered':8} {'warm' if key == warm else 'fresh'} key: "
              f"{status} after {took:.1f} s ({t0 + took - back[0]:.1f} s after Redis returned)")
        assert status == 200, (surface, stream, status, body)
        if stream:
            assert "data:" in body, body[:200]
        else:
            assert (body["choices"][0]["message"]["content"] if surface == "chat" else body["content"][0]["text"]), body
    healthy(stack)


def test_a_revocation_during_a_redis_outage_takes_effect_within_a_second(stack, alice):
    healthy(stack)
    row, key = ApiKey.issue(user=alice, name="revoked in the outage")
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=10) as http:
        assert http.get("/v1/models").status_code == 200  # the key is cached in the web process now
        _kill_redis(stack)
        try:
            assert http.get("/v1/models").status_code == 200  # known without Redis
            ApiKey.objects.filter(pk=row.pk).update(revoked=True)  # (a signal could not reach Redis either)
            t0, answers = time.monotonic(), []
            while time.monotonic() - t0 < 2:
                sent = time.monotonic() - t0
                answers.append((round(sent, 2), http.get("/v1/models").status_code))
                time.sleep(0.05)
        finally:
            stack.start_redis()
    late = [sent for sent, status in answers if status == 200]
    print(f"\nrevocation in a Redis outage: {len(late)} requests accepted after it, "
          f"the last sent {max(late, default=0):.2f} s after")
    assert {status for _, status in answers} <= {200, 401}, answers
    assert not late or max(late) < 1.2, answers
    assert {status for sent, status in answers if sent >= 1.2} == {401}, answers
    healthy(stack)


def test_a_reply_cut_by_a_web_process_kill_keeps_what_its_reader_received(stack, cookie):
    """The stored reply is the text the socket delivered, plus at most the one delta that was
    being delivered when the process died (chat.relay's tail log); without the log it was short
    by the text since the row's last save (up to RELAY_SAVE_EVERY_S of it: the figures printed
    as "the row held at the kill")."""
    healthy(stack)

    async def read_until_closed(ws, frames):
        try:
            while True:
                frames.append(json.loads(await ws.recv()))
        except websockets.ConnectionClosed:
            return

    async def turns():
        readers, all_frames = [], []
        for _ in range(2):
            ws = await _ws_turn(stack, cookie, LONG_PROMPT, LONG)
            frames = []
            await _until(ws, "delta", seen=frames)
            readers.append(asyncio.ensure_future(read_until_closed(ws, frames)))
            all_frames.append(frames)
        await asyncio.sleep(1.3)  # a few partial saves (every 0.5 s), and text since the last
        assert not any(f["type"] == "done" for frames in all_frames for f in frames), "a turn ended by itself"
        stack.daphne.kill()
        await asyncio.wait_for(asyncio.gather(*readers), 10)
        return all_frames

    loop = asyncio.new_event_loop()
    try:
        all_frames = loop.run_until_complete(turns())
    finally:
        close_loop(loop)
    stack.daphne.wait()
    received, biggest = {}, {}
    for frames in all_frames:
        for f in frames:
            if f["type"] == "delta":
                text = received.get(f["message"], "")
                assert f["offset"] == len(text), (f["offset"], len(text))
                received[f["message"]] = text + f["text"]
                biggest[f["message"]] = max(biggest.get(f["message"], 0), len(f["text"]))
    saved = {m.pk: m.text for m in Message.objects.filter(pk__in=received)}  # the rows as the kill left them
    logs = {}  # each reply's tail log as the kill left it: shown when a check fails
    for m in Message.objects.filter(pk__in=received):
        pieces = stack.client().lrange(f"{stack.prefix}:1:chat:tail:{m.pk}:{m.relay_owner}", 0, -1)
        logs[m.pk] = [json.loads(p)[:1] + [len(json.loads(p)[1])] + json.loads(p)[2:] for p in pieces]
    stack.start_daphne()

    def swept():
        rows = list(Message.objects.filter(pk__in=received))
        return all(m.status != "streaming" for m in rows) and rows
    rows = wait_until(swept, 30, "the sweep of the cut-off replies")
    print("\nDaphne kill -9 mid-reply: (chars the reader received / the row held at the kill / stored after the sweep)")
    for m in rows:
        seen = received[m.pk]
        print(f"  message {m.pk}: {len(seen)} / {len(saved[m.pk])} / {len(m.text)}"
              f" (largest delta {biggest[m.pk]})")
        assert m.status == "interrupted", m.status
        assert m.text.startswith(seen), (len(seen), len(m.text), "log [offset, length]:", logs[m.pk][-40:])
        # Beyond it, at most the delta being delivered at the kill: the reader cannot know its
        # size, so the check is the largest delta it got or 512 characters, whichever is more.
        assert len(m.text) - len(seen) <= max(biggest[m.pk], 512), (len(m.text), len(seen), biggest[m.pk])
    healthy(stack)
