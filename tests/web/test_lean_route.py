"""The API's generation and model routes take the short middleware chain (colibri_base/lean.py);
pages keep theirs. Through the real ASGI application, as Daphne calls it."""
import pytest
from channels.testing import HttpCommunicator

from api.models import ApiKey
from colibri_site.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)  # asyncio_mode = "auto" runs the async ones


def headers_of(response):
    return {k.decode().lower(): v.decode() for k, v in response["headers"]}


async def get(path, key=None):
    headers = [(b"host", b"localhost")] + ([(b"authorization", f"Bearer {key}".encode())] if key else [])
    return await HttpCommunicator(application, "GET", path, headers=headers).get_response(timeout=10)


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="t")[1]


async def test_it_serves_the_api_without_the_page_middleware(key):
    response = await get("/v1/models", key)
    headers = headers_of(response)
    assert response["status"] == 200, response["body"][:200]
    assert headers["x-content-type-options"] == "nosniff"      # the security headers stay
    assert "content-security-policy" not in headers              # the page chain (django-csp) did not run
    assert "vary" not in headers or "cookie" not in headers["vary"].lower()  # nor sessions


async def test_it_refuses_a_missing_key_in_the_api_envelope():
    response = await get("/v1/models")
    assert response["status"] == 401 and b'"error"' in response["body"]


async def test_pages_keep_the_page_middleware():
    headers = headers_of(await get("/accounts/login/"))
    assert "content-security-policy" in headers and "csrftoken" in headers.get("set-cookie", "")
    headers = headers_of(await get("/v1/stats"))  # not a lean path: sessions may serve a staff page
    assert "x-content-type-options" in headers


async def post_stream(body, headers):
    """POST through the ASGI app, the whole streamed body (HttpCommunicator wants a body key in
    the final message, which ASGI makes optional and Django's streaming responses omit)."""
    from asgiref.testing import ApplicationCommunicator

    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "headers": headers, "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 5000)}
    comm = ApplicationCommunicator(application, scope)
    await comm.send_input({"type": "http.request", "body": body})
    start = await comm.receive_output(10)
    chunks = []
    while True:
        message = await comm.receive_output(10)
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return start["status"], b"".join(chunks)


async def test_a_generation_request_starts_no_thread(fake_bridge, monkeypatch, alice_key):
    """Admission (key, limits), the view and the response all run on the event loop: Django's
    per-request thread and adrf's sync_to_async(initial) are gone (issue 14's profile)."""
    import threading

    from api import keycache
    from tests.web.fakes import reply, serve_state

    # The entry's 1 s re-read (for changes no signal reports) is a database read in a thread by
    # design; a slow host took longer than that for the 3 requests (CI, stop 30): keep it fresh.
    monkeypatch.setattr(keycache, "MAX_AGE_S", 300.0)
    fake_bridge.script(*reply("Hel", "lo"))
    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})
    body = b'{"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json"),
               (b"authorization", f"Bearer {alice_key}".encode())]
    status, _ = await post_stream(body, headers)
    assert status == 200  # the key is now in memory, and its last_used written
    started = []
    real_start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), real_start(self)))
    for _ in range(3):
        status, content = await post_stream(body, headers)
        assert status == 200 and b'"Hel"' in content and b"data: [DONE]" in content
    # The parse runs on the loop's default pool (asyncio_N, kept and reused). That pool may add a
    # worker when a job comes before the last one's worker has marked itself idle (it sets the
    # result first: on a busy CI host the next request came in between): a kept thread,
    # not one per request. Django's per-request thread and asgiref's would be ThreadPoolExecutor-N.
    assert [name for name in started if not name.startswith("asyncio_")] == []
    assert len(started) < 3, started  # not one per request


async def test_api_answers_are_made_and_rendered_without_a_thread_hop(fake_bridge, monkeypatch, alice_key):
    """The model routes' views, a buffered generation's JSON, an error envelope and a CORS
    preflight are all rendered on the event loop: Django would run a sync view, and render any
    response that has render() (DRF's Response), through sync_to_async, a hop to a worker thread
    for each (api.loopview.rendered_on_loop)."""
    from asgiref.sync import SyncToAsync

    from tests.web.fakes import reply, serve_state

    from api import keycache

    fake_bridge.script(*reply("Hi"))
    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})
    # The key stays in memory for the whole test: with the 1 s bound (keycache.MAX_AGE_S) a busy CI
    # host took longer than that over these requests, and the row's re-read is a hop by design.
    monkeypatch.setattr(keycache, "MAX_AGE_S", 600.0)
    auth = [(b"host", b"localhost"), (b"authorization", f"Bearer {alice_key}".encode())]
    assert (await get("/v1/models", alice_key))["status"] == 200  # the key is now in memory
    hops = []
    real_call = SyncToAsync.__call__

    async def counted(self, *args, **kwargs):
        hops.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await real_call(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    listed = await get("/v1/models", alice_key)
    one = await get("/v1/models/tiny", alice_key)
    status, buffered = await post_stream(b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}',
                                         auth + [(b"content-type", b"application/json")])
    preflight = await HttpCommunicator(application, "OPTIONS", "/v1/chat/completions", headers=[
        (b"host", b"localhost"), (b"origin", b"https://example.org"),
        (b"access-control-request-method", b"POST")]).get_response(timeout=10)
    assert listed["status"] == 200 and b'"object":"list"' in listed["body"].replace(b" ", b"")
    assert one["status"] == 200
    assert status == 200 and b'"Hi"' in buffered and b'"usage"' in buffered
    assert preflight["status"] == 204 and headers_of(preflight)["access-control-allow-origin"] == "*"
    assert hops == [], hops
    # Errors render on the loop too; what hops remains is Django's own error log line (its
    # handler logs every 4xx in a thread) and the database lookup of a key not in memory.
    missing = await get("/v1/models/nope", alice_key)
    refused = await get("/v1/models", "sk-not-a-key")
    assert missing["status"] == 404 and b"model_not_found" in missing["body"]
    assert refused["status"] == 401 and b'"error"' in refused["body"]
    assert sorted(hops) == ["database_call.<locals>.call", "log_response", "log_response"], hops


async def test_the_model_list_runs_no_executor_job(fake_bridge, monkeypatch, alice_key):
    """GET /v1/models reads the registry and each model's facts on the loop (it read them in a
    worker thread through asyncio.to_thread: a hop per listing, which SDKs make at start-up)."""
    import asyncio.base_events

    from api import keycache
    from tests.web.fakes import serve_state

    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})
    monkeypatch.setattr(keycache, "MAX_AGE_S", 600.0)  # no re-read of the row on a slow host
    assert (await get("/v1/models", alice_key))["status"] == 200  # the key is now in memory
    jobs = []
    real = asyncio.base_events.BaseEventLoop.run_in_executor

    def counted(self, executor, func, *args):
        jobs.append(getattr(func, "__qualname__", repr(func)))
        return real(self, executor, func, *args)

    monkeypatch.setattr(asyncio.base_events.BaseEventLoop, "run_in_executor", counted)
    listed = await get("/v1/models", alice_key)
    assert listed["status"] == 200 and b"tiny" in listed["body"]
    assert jobs == [], jobs


def test_twisteds_content_type_parse_is_remembered_with_the_same_answers():
    from twisted.web import http

    parse = http._parseContentType
    assert parse(b"application/json; charset=utf-8") == b"application/json"
    assert parse(b"multipart/form-data; boundary=xyz") == b"multipart/form-data"
    assert parse(b"Application/X-WWW-Form-URLencoded") == b"application/x-www-form-urlencoded"
    hits = parse.cache_info().hits
    assert parse(b"application/json; charset=utf-8") == b"application/json"
    assert parse.cache_info().hits == hits + 1


async def test_a_generation_submits_to_the_bridge_boot_read_with_the_served_facts(fake_bridge, monkeypatch, alice_key):
    """One Redis read gives the served model's facts and the running bridge's boot: generate() is
    handed that boot instead of asking Redis again before the submit (issue 14)."""
    from tests.web.fakes import reply, serve_state

    fake_bridge.script(*reply("Hi"))
    serve_state(monkeypatch, {"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}},
                boot="boot-42")
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json"),
               (b"authorization", f"Bearer {alice_key}".encode())]
    for stream in (b"true", b"false"):
        body = b'{"model": "tiny", "stream": %s, "messages": [{"role": "user", "content": "hi"}]}' % stream
        status, content = await post_stream(body, headers)
        assert status == 200 and b"Hi" in content
    assert fake_bridge.boots == ["boot-42", "boot-42"]


def test_daphne_turns_nagles_algorithm_off_on_the_connection_of_each_request():
    """Twisted's accepted sockets keep Nagle's algorithm on: a stream's second small write waited
    for the client's (delayed) ACK of the first. The transport here is a stand-in that records
    the option; the wrapper is what colibri_site.asgi installs on Daphne's WebRequest."""
    from daphne.http_protocol import WebRequest

    from colibri_site.asgi import _without_nagle

    calls = []

    class Transport:
        def setTcpNoDelay(self, enabled):
            calls.append(("nodelay", enabled))

    class Request:
        channel = type("Channel", (), {"transport": Transport()})()

    process = _without_nagle(lambda self: calls.append(("process", None)))
    process(Request())
    assert calls == [("nodelay", True), ("process", None)]  # before anything is written
    assert getattr(WebRequest.process, "nagle_off", False)  # installed on Daphne's own request class


def test_twisted_formats_no_access_line_that_daphne_would_discard():
    """Twisted's HTTPFactory.log formats a Combined Log Format line per request for its own log,
    which Daphne discards (Daphne keeps its own access log): the factory Daphne serves with writes
    nothing. The request is a stand-in: formatting a real one is what must not happen."""
    import io

    from daphne.http_protocol import HTTPFactory

    factory = HTTPFactory(server=None)
    factory._logFile = io.StringIO()
    factory.log(object())  # Twisted's formatter would fail on this stand-in
    assert factory._logFile.getvalue() == ""


async def test_an_unknown_api_route_is_refused_in_the_envelope_on_the_short_chain(alice_key):
    """An SDK pointed at a route we lack (/v1/embeddings) gets the OpenAI envelope's 404 from the
    API's chain, not the page chain (its ~20 thread hops per call)."""
    response = await get("/v1/embeddings", alice_key)
    headers = headers_of(response)
    assert response["status"] == 404 and b"unknown_route" in response["body"]
    assert "content-security-policy" not in headers and headers["x-content-type-options"] == "nosniff"
    stats = headers_of(await get("/v1/stats"))
    assert "content-security-policy" in stats  # the staff page keeps the page chain
