"""The atlas builder against the real bridge and engine on the fixture model: it runs every probe
to 100 %, writes an experts.json in colibri's format, and builds the same bytes twice — the
second time while other requests keep arriving (their HITS must not leak into the counts)."""
import asyncio
import contextlib
import threading

import pytest
from channels.layers import channel_layers
from django.test.utils import override_settings

from engine_bridge.client import GenerationRequest, generate
from experts import atlas_format, builder, services
from experts.models import Atlas, AtlasBuild
from tests.support import procs

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def bridge(engine_binary, tiny_model):
    url = procs.claim_redis_db()
    env = {"REDIS_URL": url, "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "KV_SLOTS": "2", "CTX": "2048",
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
    build = services.build_start(enqueue=False)
    build = services.build_run(build_id=build.pk, on_probe=lambda done, total, probe: seen.append((done, total)),
                               on_retry=lambda probe, attempt: retries.append(probe) if retries is not None else None)
    return build, seen


@contextlib.contextmanager
def other_traffic():
    """Interactive requests of ~60 tokens with 0.3 s pauses, from another thread, while the body runs."""
    stop = threading.Event()

    async def loop():
        while not stop.is_set():
            request = GenerationRequest(prompt="Tell me about the weather.", max_tokens=60)
            async with contextlib.aclosing(generate(request)) as events:
                async for _ in events:
                    pass
            await asyncio.sleep(0.3)

    thread = threading.Thread(target=lambda: asyncio.run(loop()))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


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
    assert 0 <= first.atlas.validation["correct"] <= first.atlas.validation["total"] == len(probes)

    retries = []
    with other_traffic():
        second, _ = build_once(retries)
    assert second.status == AtlasBuild.DONE, second.error
    assert retries, "no probe overlapped the other traffic: the test did not test contamination"
    assert bytes(second.atlas.content) == bytes(first.atlas.content)
    assert Atlas.objects.count() == 2  # the second build added a row; the first is kept
