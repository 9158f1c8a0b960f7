"""Several real bridges (run_bridge, each with the real engine on a fixture model) on one Redis
(issue 26 items 2 and 6): requests go to a bridge of the model they name, a conversation keeps its
bridge across turns (and the engine reuses its cache there), a bridge killed mid-stream ends its
own streams with a clean error while the other keeps streaming and the conversation's next turn
lands on the survivor, and a bridge started live joins the rotation.

Each test's bridges serve a model file of their own (the stem is the served id), so what one test
starts or kills never routes another's requests."""
import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_bridge import registry, served
from engine_bridge.client import generate
from tests.bridge.conftest import bridge_env
from tests.bridge.helpers import (
    CHATML, LONG, collect, count_texts, final, first_text, fixture_model, is_busy, is_gone, is_up, registered,
    routed_to, serving, text_of, turn, until)
from tests.support import procs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("several-models")


def _start(redis_url: str, engine_binary: Path, model: Path, bridge: str) -> subprocess.Popen:
    return procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary), ENGINE_MODEL=str(model),
                                         CTX="131072", BRIDGE_ID=bridge))


@contextlib.contextmanager
def _bridges(redis_url: str, engine_binary: Path, specs: list[tuple[str, Path]]) -> Iterator[dict]:
    started: dict[str, subprocess.Popen] = {}
    try:
        for bridge, model in specs:
            started[bridge] = _start(redis_url, engine_binary, model, bridge)
        yield started
    finally:
        for proc in started.values():
            procs.stop(proc)


async def test_requests_go_to_a_bridge_of_the_model_they_name(redis_url: str, engine_binary: Path, model_dir: Path) -> None:
    a, b = fixture_model(model_dir, "tiny-route-a", 1), fixture_model(model_dir, "tiny-route-b", 2)
    with _bridges(redis_url, engine_binary, [("ra", a), ("rb", b)]):
        await until(lambda: registered(("ra", "rb")), 5, "both registrations")
        ordinals: dict[str, list] = {"ra": [], "rb": []}
        for model, bridge in (("tiny-route-b", "rb"), ("tiny-route-a", "ra"), ("tiny-route-b", "rb")):
            events = await collect(turn(model, CHATML.format("hello")))
            assert routed_to(events) == bridge and final(events)["kind"] == "done", events
            ordinals[bridge].append(final(events)["ended"])
        # each final event numbers its end on its bridge, and the registration counts them: how
        # a router knows which ends a registration has seen (engine_bridge.client._unseen)
        assert ordinals == {"ra": [1], "rb": [1, 2]}
        await until(lambda: _ended_counts({"ra": 1, "rb": 2}), 3, "the registrations to count the ends")
        missing = final(await collect(turn("tiny-route-z", CHATML.format("hello"))))
        assert missing["code"] == "ENGINE_UNAVAILABLE" and "tiny-route-z" in missing["message"]
        models = {m.id: m.bridges for m in served.served_models_get()}
        assert models["tiny-route-a"] == ("ra",) and models["tiny-route-b"] == ("rb",)
        assert served.served_model_get("tiny-route-b").bridges == ("rb",)
        assert served.served_model_get("no-such-model") is None  # bridges live, none serves it: 404
        infos = {i.id: i for i in registry.bridges_get()}
        assert infos["ra"].model == "tiny-route-a" and infos["ra"].slots == 2 and infos["ra"].status == "up"
        assert infos["ra"].fingerprint and infos["ra"].fingerprint != infos["rb"].fingerprint


async def _ended_counts(expected: dict[str, int]) -> bool:
    return {i.id: i.ended for i in await registry.abridges_get() if i.id in expected} == expected


@pytest.mark.parametrize("keyed", [True, False], ids=["by-conversation", "by-prefix"])
async def test_a_conversation_keeps_its_bridge_across_turns_and_its_cache_there(
        redis_url: str, engine_binary: Path, model_dir: Path, keyed: bool) -> None:
    """Keyed: the chat's conversation_key finds its slot's bridge. Unkeyed (a stateless API
    client resending the history): the prompt's prefix chain does, its history being longer than
    routing.MIN_PREFIX_BLOCKS blocks."""
    name = f"tiny-affinity-{keyed}".lower()
    model = fixture_model(model_dir, name, 3)
    with _bridges(redis_url, engine_binary, [("fa", model), ("fb", model)]):
        await until(lambda: registered(("fa", "fb")), 5, "both registrations")
        homes: dict[str, set] = {}
        for n in range(6):
            key = f"conv:{n}"
            prompt = CHATML.format(f"conversation {n} begins with a question. " + "Some context. " * 50)
            for _turn_no in range(3):
                events = await collect(turn(name, prompt, key if keyed else None))
                homes.setdefault(key, set()).add(routed_to(events))
                accepted = next(e for e in events if e["kind"] == "accepted")
                if _turn_no:
                    assert accepted["reused"] and accepted["reused"] > 0, accepted  # the slot's cache served it
                prompt += text_of(events) + "<|im_end|>\n" + CHATML.format(f"and then {_turn_no}?")
        assert all(len(h) == 1 for h in homes.values()), homes  # every turn where its first went


async def test_a_bridge_killed_mid_stream_ends_only_its_streams_and_the_next_turn_lands_elsewhere(
        redis_url: str, engine_binary: Path, model_dir: Path) -> None:
    model = fixture_model(model_dir, "tiny-failover", 4, "--mute-eos")  # long turns end only when told
    with _bridges(redis_url, engine_binary, [("ka", model), ("kb", model)]) as procs_by_id:
        await until(lambda: registered(("ka", "kb")), 5, "both registrations")
        first = await collect(turn("tiny-failover", CHATML.format("remember me"), "conv:kill"))
        home = routed_to(first)
        doomed = generate(turn("tiny-failover", CHATML.format("remember me") + text_of(first), "conv:kill", LONG))
        head = await first_text(doomed)
        assert routed_to(head) == home
        await until(lambda: is_busy(home), 3, "the long turn to be published")
        other = generate(turn("tiny-failover", CHATML.format("another story"), "conv:other", LONG))
        survivor = routed_to(await first_text(other))
        assert survivor != home  # the two choices take the idle bridge
        procs_by_id[home].send_signal(signal.SIGKILL)
        procs_by_id[home].wait()
        t0 = time.monotonic()
        await until(lambda: is_gone(home), 3, "the killed bridge to leave the rotation")
        assert time.monotonic() - t0 < 2.5  # its last beat was at most liveness.STALE_S old
        async with contextlib.aclosing(doomed):
            ended = [e async for e in doomed]
        error = final(ended)
        assert error["code"] == "ENGINE_UNAVAILABLE" and "engine host went away" in error["message"], error
        assert f"bridge {home}" in error["message"] and time.monotonic() - t0 < 6
        async with contextlib.aclosing(other):  # the survivor kept streaming meanwhile
            assert await count_texts(other, 5) == 5
        again = await collect(turn("tiny-failover", CHATML.format("remember me again"), "conv:kill"))
        assert routed_to(again) == survivor and final(again)["kind"] == "done"  # re-prefilled there


async def test_a_bridge_started_live_joins_the_rotation(redis_url: str, engine_binary: Path, model_dir: Path) -> None:
    model = fixture_model(model_dir, "tiny-join", 5, "--mute-eos")
    with _bridges(redis_url, engine_binary, [("ja", model)]) as started:
        busy = generate(turn("tiny-join", CHATML.format("a long story"), None, LONG))
        assert routed_to(await first_text(busy)) == "ja"
        await until(lambda: is_busy("ja"), 3, "the long turn to be published")
        # in a thread: the loop must go on renewing its lease, or ja cancels the busy stream
        started["jb"] = await asyncio.to_thread(_start, redis_url, engine_binary, model, "jb")
        await until(lambda: is_up("jb"), 5, "the new bridge's registration, its engine up")
        assert await serving("tiny-join") == ("ja", "jb")
        snapshot = await registry.abridges_get()
        events = await collect(turn("tiny-join", CHATML.format("hello newcomer")))
        assert routed_to(events) == "jb", [(b.id, b.status, b.busy, b.queued) for b in snapshot]  # the idle one
        assert final(events)["kind"] == "done"
        await busy.aclose()
