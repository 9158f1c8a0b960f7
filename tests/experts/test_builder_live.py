"""The atlas builder against the real bridge and engine on the fixture model: it runs every probe
to 100 %, writes an experts.json in colibri's format, and builds the same bytes twice — the
second time while other requests keep arriving (their routing must not leak into the counts).
Our engine reports per-request routing (routes=1), so that is the method used; the HITS method
(engines without our extensions) is run too, by pretending the engine has none. Probes are sent
with heat=0: a build leaves the engine's usage heat (EMAP heat) as it was."""
import asyncio
import contextlib
import io
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers
from django.core.management import call_command
from django.test.utils import override_settings

from engine_bridge import telemetry
from engine_bridge.client import generate
from engine_bridge.request import GenerationRequest
from experts import atlas_format, builder, services
from experts.models import Atlas, AtlasBuild
from tests.support import procs

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def bridge(engine_binary, tiny_model):
    url = procs.claim_redis_db()
    # USAGE_FILE=/dev/null: the engine starts with no usage heat (another test's saved usage file
    # next to the fixture model would start it near 2^12 selections, where one control turn may
    # not move any expert's heat, a log2 of its count).
    env = {"REDIS_URL": url, "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0,USAGE_FILE=/dev/null", "KV_SLOTS": "2", "CTX": "2048",
           "ENGINE_BINARY": str(engine_binary), "ENGINE_MODEL": str(tiny_model)}
    proc = procs.start_bridge(env)
    layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                          "CONFIG": {"hosts": [url], "capacity": 1000, "expiry": 60}}}
    try:
        with override_settings(REDIS_URL=url, CHANNEL_LAYERS=layers, ENGINE_MODEL=str(tiny_model)):
            channel_layers.backends.clear()
            yield url
    finally:
        channel_layers.backends.clear()
        procs.stop(proc)
        procs.release_redis_db(url)


def build_once(retries=None):
    seen = []
    build = services.build_start()
    build = services.build_run(build_id=build.pk, on_probe=lambda done, total, probe: seen.append((done, total)),
                               on_retry=lambda probe, attempt: retries.append(probe) if retries is not None else None)
    return build, seen


@contextlib.contextmanager
def other_traffic(pause=0.3):
    """Interactive requests of ~60 tokens with `pause` s between them, from another thread, while
    the body runs; yields a list that holds one entry per request finished."""
    stop, finished = threading.Event(), []

    async def loop():
        while not stop.is_set():
            request = GenerationRequest(prompt="Tell me about the weather.", max_tokens=60)
            async with contextlib.aclosing(generate(request)) as events:
                async for event in events:
                    if event["kind"] == "done":
                        finished.append(event)
            await asyncio.sleep(pause)

    thread = threading.Thread(target=lambda: asyncio.run(loop()))
    thread.start()
    try:
        yield finished
    finally:
        stop.set()
        thread.join(30)


def heat(settle=1.0):
    """The usage heat of every expert (low 6 bits of each EMAP byte) in the bridge's telemetry,
    read after `settle` s (the bridge writes its state at most every 0.1 s)."""
    time.sleep(settle)
    emap = telemetry.get_state()["emap"]
    return [b & 63 for b in bytes.fromhex(emap["hex"])]


async def one_turn(**fields):
    request = GenerationRequest(prompt="Tell me a long story about a dragon.", max_tokens=40, **fields)
    async with contextlib.aclosing(generate(request)) as events:
        return [e async for e in events][-1]


def test_a_build_leaves_the_usage_heat_alone(bridge):
    """Runs first, on a fresh engine: probes (heat=0) add nothing to EMAP heat; a turn does."""
    before = heat()
    build, _ = build_once()
    assert build.status == AtlasBuild.DONE, build.error
    assert build.atlas.validation["method"] == "routes"
    assert heat() == before, "the probes changed the engine's usage heat"
    done = async_to_sync(one_turn)()  # the control: an ordinary request counts
    assert done["kind"] == "done"
    assert heat() != before, "the control turn did not change the heat either: the test proves nothing"


def test_it_builds_a_valid_reproducible_atlas_on_the_fixture_model(bridge):
    first, seen = build_once()
    assert first.status == AtlasBuild.DONE, first.error
    probes, _, _ = builder.load_probes()
    assert seen[-1] == (len(probes), len(probes)) and first.done == first.total == len(probes)
    doc = atlas_format.loads(bytes(first.atlas.content))
    assert len(doc["categories"]) >= 10
    assert doc["experts"], "no expert passed the replication gate"
    layers = {atlas_format.parse_key(k)[0] for k in doc["experts"]}
    assert layers <= {0, 1, 2, 3}  # the fixture model: 4 MoE layers x 8 experts
    validation = first.atlas.validation
    assert 0 <= validation["correct"] <= validation["total"] == len(probes)
    assert validation["method"] == "routes" and validation["top_k"] == 2 and validation["n_experts"] == 8

    with other_traffic(pause=0.02) as finished:
        second, _ = build_once()
    assert second.status == AtlasBuild.DONE, second.error
    assert len(finished) >= 2, "too little other traffic ran during the build to test leaks"
    assert bytes(second.atlas.content) == bytes(first.atlas.content)
    assert Atlas.objects.filter(model_name=first.model_name).count() >= 2  # a build adds a row; none is replaced


def test_a_probe_that_reused_kv_is_run_again(bridge, monkeypatch):
    """ROUTES counts only what a turn prefilled: a probe that reused KV would count less. The
    runner's reset normally prevents it; here the reset is skipped once, so the probe repeats
    the previous probe's text on a slot that holds it (reused > 0) and must be run again."""
    probe = builder.load_probes()[0][0]
    runner = builder.RoutesRunner(key="atlas-test-reuse")

    async def twice():
        clean = await runner.run(probe)
        accepted, _ = await runner._generate(probe.text, routes=True)  # the slot now holds the probe
        original = runner._generate

        async def no_reset(prompt, routes):
            if prompt == builder.RESET_PROMPT:
                return {}, {}
            return await original(prompt, routes)
        runner._generate = no_reset
        return clean, await runner.run(probe)

    clean, again = async_to_sync(twice)()
    assert clean is not None and clean.sum() > 0
    assert again is None


def test_the_hits_method_still_builds_for_engines_without_routing(bridge, monkeypatch):
    """Engines without our extensions: HITS windows. (Its rebuild under concurrent traffic, the
    test before routes=1, ran past the 300 s test timeout on a loaded host: contaminated probes
    back off up to 30 s each; not run here.)"""
    monkeypatch.setattr(builder, "routes_supported", lambda model: False)
    build, _ = build_once()
    assert build.status == AtlasBuild.DONE, build.error
    assert build.atlas.validation["method"] == "hits" and build.atlas.validation["chunk_words"] >= 1
    atlas_format.loads(bytes(build.atlas.content))


def test_manage_py_build_atlas_probes_at_the_count_it_is_given(bridge):
    out = io.StringIO()
    call_command("build_atlas", "--experts", "4", stdout=out)
    assert "method routes, experts 4," in out.getvalue()
    assert Atlas.objects.first().validation["experts"] == 4
