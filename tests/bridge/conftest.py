"""Bridge test fixtures: a Redis database of our own (so the `engine-bridge` channel is not shared
with other test sessions), settings pointing at it, and bridge worker processes."""
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from channels.layers import channel_layers
from django.test.utils import override_settings

from tests.support import procs

FAKES = Path(__file__).parent / "fake_engines"


@pytest.fixture(scope="session")
def redis_url():
    url = procs.claim_redis_db()
    yield url
    procs.release_redis_db(url)


@contextlib.contextmanager
def redis_settings(url):
    """This process's settings on the Redis at `url` (REDIS_URL and a channel layer there), with
    no channel layer kept from before or after."""
    layers = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                          "CONFIG": {"hosts": [url], "capacity": 1000, "expiry": 60}}}
    with override_settings(REDIS_URL=url, CHANNEL_LAYERS=layers):
        channel_layers.backends.clear()
        try:
            yield
        finally:
            channel_layers.backends.clear()


@pytest.fixture(scope="session", autouse=True)
def bridge_settings(redis_url):
    with redis_settings(redis_url):
        yield


@pytest.fixture(autouse=True)
def fresh_layer():
    channel_layers.backends.clear()  # a layer per test: each test has its own event loop
    yield
    channel_layers.backends.clear()


def bridge_env(redis_url, **extra):
    env = {"REDIS_URL": redis_url, "ENGINE_ENV": "KVSAVE=0,USAGE_SAVE=0", "KV_SLOTS": "2",
           "CTX": "256", "LOG_LEVEL": "INFO", "BRIDGE_QUEUE_LIMIT": "4"}
    env.update(extra)
    return env


def fake_command(name):
    return f"{sys.executable} {FAKES / name}"


@pytest.fixture(scope="module")
def real_bridge(engine_binary, tiny_model, redis_url):
    # CTX 2048 (the fixture model's own): room for a generation long enough to cancel mid-stream.
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(tiny_model), CTX="2048"))
    yield proc
    procs.stop(proc)


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of this test's own, so stopping it disturbs nobody else."""
    port = procs.free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path)]

    class Server:
        url = f"redis://127.0.0.1:{port}/0"
        proc = None

        def start(self):
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
            procs.wait_for_port(port, self.proc)

        def stop(self):
            procs.stop(self.proc)

        def freeze(self):  # SIGSTOP: connections are accepted, nothing is answered
            self.proc.send_signal(signal.SIGSTOP)

        def thaw(self):
            self.proc.send_signal(signal.SIGCONT)

    server = Server()
    server.start()
    with redis_settings(server.url):
        yield server
    if server.proc is not None:
        server.thaw()  # never leave a stopped server behind
    server.stop()
