"""Three engine hosts as they run in production (issue 26 item 6), on this machine: each host a
network namespace cabled to a private LAN (tests/support/netns.py), running one real `run_bridge`
with the real engine on a fixture model (h1 and h2 serve model A, h3 serves model B); one Redis
on the LAN's root-side address, the only thing the hosts reach (not the database: an engine host
never needs it); the web process in the root namespace is this test process, routing with
engine_bridge.client.generate, and for the SDK test a Daphne on the same Redis.

What holds, each a test: requests land on the hosts of the model they name; a returning
conversation lands on the host that holds it (>= 95 % of returning turns, measured, keyed by
conversation and by prefix alone); the web process (Daphne, the openai SDK) serves both models
from their hosts; a host added live (h4) joins the rotation and takes new conversations; a host whose cable is pulled mid-stream ends its streams with a clean error
naming it, the other hosts' streams keep going and finish, and the conversation's next turn is
answered by another host. The cable test runs last: it leaves its host powered off.
"""
import asyncio
import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from engine_bridge import client, registry, served
from engine_bridge.client import generate
from tests.bridge.conftest import bridge_env, redis_settings
from tests.bridge.helpers import (
    CHATML, LONG, collect, final, first_text, fixture_model, is_busy, is_gone, is_up, registered, routed_to,
    serving, text_of, turn, until)
from tests.support import procs
from tests.support.netns import Host, Lab
from tests.web import live

A, B = "tiny-netns-a", "tiny-netns-b"  # the served ids (the model files' stems)
PLAN = {"h1": A, "h2": A, "h3": B}
AFFINITY_FLOOR = 0.95


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The LAN and its Redis; this process's settings point at that Redis while the module runs."""
    network = Lab(tmp_path_factory.mktemp("netns-redis"))
    try:
        network.open()
        with redis_settings(network.redis_url):
            yield network
    finally:
        network.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both fixture models never end a reply by themselves: short turns end at max_tokens, long
    ones when told (gen.stop), so a stream outlasts any fault the tests make."""
    folder = tmp_path_factory.mktemp("netns-models")
    return {A: fixture_model(folder, A, 21, "--mute-eos"), B: fixture_model(folder, B, 22, "--mute-eos")}


def start_host_bridge(lab: Lab, host: Host, engine_binary: Path, model: Path) -> subprocess.Popen:
    """run_bridge inside `host` (its id the host's name, its BRIDGE_HOST the namespace), returned
    once its engine is up. 16 slots: the affinity test's 20 conversations all keep theirs."""
    env = bridge_env(lab.redis_url, ENGINE_BINARY=str(engine_binary), ENGINE_MODEL=str(model), KV_SLOTS="16",
                     CTX="131072", BRIDGE_QUEUE_LIMIT="32", BRIDGE_ID=host.name, BRIDGE_HOST=host.ns)
    return procs.start_bridge(env, argv_prefix=host.exec_prefix())


@pytest.fixture(scope="module")
def hosts(lab: Lab, engine_binary: Path, models: dict[str, Path]) -> Iterator[dict[str, subprocess.Popen]]:
    """h1, h2 (model A) and h3 (model B), started side by side; stopped at the end."""
    started: dict[str, subprocess.Popen] = {}
    try:
        with ThreadPoolExecutor(len(PLAN)) as pool:
            futures = {name: pool.submit(start_host_bridge, lab, lab.add_host(name), engine_binary, models[model])
                       for name, model in PLAN.items()}
            for name, future in futures.items():
                started[name] = future.result()
        yield started
    finally:
        for proc in started.values():
            procs.stop(proc)


@pytest.fixture(scope="module")
def web(lab: Lab, hosts: dict, django_db_setup: None, django_db_blocker,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The one web process as deployed: Daphne in the root namespace on the LAN's Redis and the
    test database; its base URL."""
    with django_db_blocker.unblock():
        database_url = live._database_url()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "colibri_site.settings", "COLIBRI_DEV": "1",
           "DATABASE_URL": database_url, "REDIS_URL": lab.redis_url, "CELERY_BROKER_URL": lab.redis_url,
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "PGAPPNAME": live.SERVER_APP, "PYTHONUNBUFFERED": "1"}
    port = procs.free_port()
    with open(tmp_path_factory.mktemp("netns-web") / "daphne.log", "wb") as log:
        daphne = live.start_daphne(env, port, log)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            procs.stop(daphne)
            with django_db_blocker.unblock():
                live._close_other_sessions(live.SERVER_APP)


def test_without_ip_the_lab_refuses_naming_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `ip` on PATH: a clear failure naming iproute2, never a skip (CI runs these as root)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    refused = Lab(tmp_path)
    with pytest.raises(RuntimeError, match="iproute2"):
        refused.open()
    refused.close()  # the fixture's teardown after such a refusal: it must not raise over it


_PROBE = """
import json, socket, sys
def reach(host, port):
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return "open"
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({f"{h}:{p}": reach(h, p) for h, p in (a.rsplit(":", 1) for a in sys.argv[1:])}))
"""


def test_a_host_reaches_the_lans_redis_and_nothing_of_the_machine(lab: Lab, hosts: dict) -> None:
    """What makes the namespaces hosts: from h1 the LAN's Redis answers, while this machine's
    loopback services (its PostgreSQL, its system Redis) and its own address are out of reach,
    so the bridges are proven to run on Redis alone, as an engine host does."""
    redis_at = lab.redis_url.removeprefix("redis://").rsplit("/", 1)[0]
    targets = [redis_at, "127.0.0.1:5432", "127.0.0.1:6379", f"{lab.hosts['h2'].address}:1"]
    out = subprocess.run([*lab.hosts["h1"].exec_prefix(), procs.PYTHON, "-c", _PROBE, *targets],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    seen = json.loads(out)
    assert seen[redis_at] == "open", seen
    assert seen["127.0.0.1:5432"] != "open" and seen["127.0.0.1:6379"] != "open", seen
    assert seen[targets[3]] == "ConnectionRefusedError", seen  # h2 is on the LAN (nothing listens on port 1)


async def _ready() -> None:
    await until(lambda: registered(tuple(PLAN)), 5, "the three hosts' registrations")


async def test_requests_land_on_the_hosts_of_the_model_they_name(lab: Lab, hosts: dict) -> None:
    """16 requests per model, one at a time: model B's all on h3, model A's on h1 and h2 both;
    the registry names each host's own model and host (its namespace, from BRIDGE_HOST)."""
    await _ready()
    landed: dict[str, Counter] = {A: Counter(), B: Counter()}
    for n in range(16):
        for model in (A, B):
            events = await collect(turn(model, CHATML.format(f"question {n}")))
            assert final(events)["kind"] == "done", events
            landed[model][routed_to(events)] += 1
    assert set(landed[B]) == {"h3"}, landed
    assert set(landed[A]) == {"h1", "h2"}, landed  # the two choices spread them (all on one: p = 2^-15)
    assert await serving(A) == ("h1", "h2") and await serving(B) == ("h3",)
    infos = {info.id: info for info in await registry.abridges_get()}
    assert {name: infos[name].host for name in PLAN} == {name: lab.hosts[name].ns for name in PLAN}
    assert {name: infos[name].model for name in PLAN} == PLAN
    assert served.served_model_get("no-such-model") is None


@pytest.mark.django_db(transaction=True)
def test_the_web_process_serves_every_hosts_model_to_the_openai_sdk(web: str, django_user_model) -> None:
    """Through Daphne and the official openai SDK (strict validation): /v1/models lists the
    models the hosts serve, a request naming a model is answered by a host of that model
    (x-colibri-bridge names it), buffered and streamed, and a model no host serves is the
    API's 404."""
    from api.models import ApiKey

    user = django_user_model.objects.create_user("netns-client", password="not used here")
    oai = openai.OpenAI(base_url=web + "/v1", api_key=ApiKey.issue(user=user, name="netns")[1], max_retries=0,
                        timeout=60, _strict_response_validation=True)
    assert {A, B} <= {m.id for m in oai.models.list().data}
    answered: dict[str, set] = {A: set(), B: set()}
    for n in range(6):
        for model in (A, B):
            raw = oai.completions.with_raw_response.create(model=model, prompt=f"Once upon a time {n}", max_tokens=8)
            assert raw.parse().choices[0].text and raw.parse().model == model
            answered[model].add(raw.headers["x-colibri-bridge"])
    assert answered[B] == {"h3"} and answered[A] <= {"h1", "h2"}, answered
    messages = [{"role": "user", "content": "Tell me a story."}]
    with oai.chat.completions.with_streaming_response.create(model=B, messages=messages, max_tokens=8,
                                                             stream=True) as streamed:
        assert streamed.headers["x-colibri-bridge"] == "h3"
        assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    with pytest.raises(openai.NotFoundError, match="tiny-netns-z"):
        oai.completions.create(model="tiny-netns-z", prompt="Once", max_tokens=8)


class _Conversation:
    """One conversation's client side: its history (the next turn's prompt), and per turn the
    host that answered, the prompt's tokens and how many of them that host's cache reused.
    Keyed: a chat's conversation_key; unkeyed: a stateless client resending its history, found
    by its prefix alone."""

    def __init__(self, mode: str, n: int) -> None:
        self.key = f"{mode}:{n}" if mode == "by-conversation" else None
        self.prompt = CHATML.format(f"[{mode} {n}] this conversation begins with a question. " + "Some context. " * 50)
        self.turns: list[tuple[str, int, int]] = []

    async def take_turn(self, gate: asyncio.Semaphore) -> None:
        async with gate:
            events = await collect(turn(A, self.prompt, self.key))
        assert final(events)["kind"] == "done", events
        accepted = next(e for e in events if e["kind"] == "accepted")
        self.turns.append((routed_to(events), accepted["prompt_tokens"], int(accepted.get("reused") or 0)))
        self.prompt += text_of(events) + "<|im_end|>\n" + CHATML.format(f"and then {len(self.turns)}?")


@pytest.mark.parametrize("mode", ["by-conversation", "by-prefix"])
async def test_a_returning_conversation_lands_on_the_host_that_holds_it(lab: Lab, hosts: dict, mode: str) -> None:
    """20 conversations x 3 turns, interleaved (every conversation's turn t before any's turn
    t+1, four requests in flight): the figure is the share of returning turns answered by the
    host that answered the conversation's first; "cached": such a turn's whole previous prompt
    was still in that host's KV cache (reused >= the previous turn's prompt tokens)."""
    await _ready()
    conversations, gate = [_Conversation(mode, n) for n in range(20)], asyncio.Semaphore(4)
    for _round in range(3):
        await asyncio.gather(*(c.take_turn(gate) for c in conversations))
    returning = [(c.turns[0][0], host, reused >= before[1]) for c in conversations
                 for before, (host, _, reused) in zip(c.turns, c.turns[1:], strict=False)]
    home = sum(first == host for first, host, _ in returning) / len(returning)
    cached = sum(first == host and kept for first, host, kept in returning) / len(returning)
    print(f"\naffinity {mode}: {home:.1%} of {len(returning)} returning turns on their host, "
          f"{cached:.1%} with its cache reused; first turns per host: "
          f"{dict(Counter(c.turns[0][0] for c in conversations))}")
    assert {c.turns[0][0] for c in conversations} == {"h1", "h2"}  # spread, or affinity would prove nothing
    assert home >= AFFINITY_FLOOR and cached >= AFFINITY_FLOOR, returning


async def _hold(model: str, prompt: str, key: str | None = None, req: str | None = None) -> tuple[AsyncIterator, str]:
    """A long stream, started and read to its first text; (the stream, the host it landed on)."""
    stream = generate(turn(model, CHATML.format(prompt), key, LONG), req)
    host = routed_to(await first_text(stream))
    await until(lambda: is_busy(host), 3, f"{host}'s busy slot to be published")
    return stream, host


async def test_a_host_added_live_joins_the_rotation_and_takes_new_conversations(
        lab: Lab, hosts: dict, engine_binary: Path, models: dict[str, Path]) -> None:
    """With h1 and h2 each busy with a long stream, a fourth host h4 (model A) is cabled and
    started: it registers within a beat of its engine being up, and new conversations go to it
    whenever the two random choices include it (the idle one wins), about 2 in 3. It leaves
    again at the end (a clean stop)."""
    await _ready()
    held = [await _hold(A, f"a long story {n}") for n in range(2)]
    assert {host for _, host in held} == {"h1", "h2"}, held  # the second went to the idle one
    proc = None
    try:
        launched = time.monotonic()
        # off the loop: it must go on renewing this process's lease, or h1/h2 cancel the long turns
        proc = await asyncio.to_thread(start_host_bridge, lab, lab.add_host("h4"), engine_binary, models[A])
        engine_up = time.monotonic()
        await until(lambda: is_up("h4"), 5, "h4's registration")
        print(f"\nh4 in the rotation {time.monotonic() - launched:.1f} s after its launch, "
              f"{time.monotonic() - engine_up:.2f} s after its engine was up")
        assert await serving(A) == ("h1", "h2", "h4")
        landed = Counter()
        for n in range(12):
            events = await collect(turn(A, CHATML.format(f"hello newcomer {n}"), f"join:{n}"))
            assert final(events)["kind"] == "done", events
            landed[routed_to(events)] += 1
        print(f"new conversations per host: {dict(landed)}")
        assert landed["h4"] >= 2, landed  # h4 is in 2 of 3 random pairs, and wins each: p(< 2) = 5e-5
    finally:
        for stream, _ in held:
            await stream.aclose()
        procs.stop(proc)
        if "h4" in lab.hosts:
            lab.power_off("h4")
    await until(lambda: is_gone("h4"), 3, "h4 to leave the rotation")


async def _stream_times(stream: AsyncIterator) -> tuple[list[float], dict]:
    """Reads a stream to its end: (the monotonic time of each text event, the final event)."""
    times: list[float] = []
    async with contextlib.aclosing(stream):
        async for event in stream:
            if event is not None and event["kind"] == "text":
                times.append(time.monotonic())
            elif event is not None and event["kind"] in ("done", "error"):
                return times, event
    raise AssertionError("the stream ended without a final event")


async def test_a_host_cut_off_mid_stream_ends_only_its_streams_and_the_conversation_moves_on(
        lab: Lab, hosts: dict) -> None:
    """The realer fault than a kill: the host's cable is pulled (its bridge and engine run on,
    reaching nothing). Its stream ends with ENGINE_UNAVAILABLE naming the bridge and its host
    within seconds; the other two hosts' streams kept yielding text throughout and finish when
    told to stop; the conversation's next turn is answered on the other A host."""
    await _ready()
    first = await collect(turn(A, CHATML.format("remember me"), "cut:conv"))
    home = routed_to(first)
    doomed, landed = await _hold(A, "remember me" + text_of(first), "cut:conv")
    assert landed == home  # the conversation's own host
    other_a, survivor = await _hold(A, "another story", "cut:other-a", "cut-other-a")
    other_b, b_host = await _hold(B, "a story of model B", "cut:other-b", "cut-other-b")
    assert survivor != home and b_host == "h3"
    readers = {req: asyncio.create_task(_stream_times(s)) for req, s in (("cut-other-a", other_a), ("cut-other-b", other_b))}
    try:
        lab.cut(home)
        cut_at = time.monotonic()
        await until(lambda: is_gone(home), 3, f"{home} to leave the rotation")
        left_s = time.monotonic() - cut_at
        ended = await asyncio.wait_for(_stream_times(doomed), 15)
        error, error_s = ended[1], time.monotonic() - cut_at
        print(f"\n{home} cut: out of the rotation in {left_s:.2f} s, its stream's error after {error_s:.2f} s")
        assert error["kind"] == "error" and error["code"] == "ENGINE_UNAVAILABLE", error
        assert f"bridge {home} on {lab.hosts[home].ns}" in error["message"] and error_s < 6, error
        for req in readers:
            await client.stop(req)
        for req, reader in readers.items():
            times, last = await asyncio.wait_for(reader, 15)
            assert last["kind"] == "done", (req, last)
            assert any(cut_at < t < cut_at + error_s for t in times), (req, "no text while the host was out")
        again = await collect(turn(A, CHATML.format("remember me again"), "cut:conv"))
        assert routed_to(again) == survivor and final(again)["kind"] == "done", again  # re-prefilled there
    finally:
        for reader in readers.values():
            reader.cancel()
        lab.power_off(home)  # its engine would decode on for nobody
        hosts[home].wait(10)
