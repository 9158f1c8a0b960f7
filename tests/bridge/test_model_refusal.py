"""An engine that refuses its model file at load (exit code 3 and a "refused" stderr line: an
architecture, tensor, key or type it does not know) is reported, not restarted: the real bridge
worker with the real engine on a generated file of an unknown architecture publishes status
"refused" with the engine's reason, /health answers it (503, engine "refused", `refusal`), a
request is answered ENGINE_UNAVAILABLE with that reason, its restart count stays 0, and once the model file is replaced by one the engine knows it starts."""
import asyncio
import os
import shutil
import struct
import subprocess
import time

import pytest

from engine_bridge.client import GenerationRequest
from tests.bridge.conftest import bridge_env
from tests.bridge.helpers import CHATML, collect, final
from tests.support import procs

pytestmark = pytest.mark.django_db


def with_unknown_architecture(src, dst):
    """src with general.architecture's value renamed (same length: the offsets stay valid)."""
    data = bytearray(src.read_bytes())
    key = b"general.architecture"
    at = data.find(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    n = struct.unpack_from("<Q", data, at)[0]
    old = bytes(data[at + 8:at + 8 + n])
    new = old[:-1] + (b"x" if old[-1:] != b"x" else b"y")
    data[at + 8:at + 8 + n] = new
    dst.write_bytes(bytes(data))
    return new.decode()


def wait_state(env, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = procs.bridge_state(env)
        if state and predicate(state):
            return state
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {procs.bridge_state(env)}")


def test_a_refused_model_is_reported_not_restarted(engine_binary, tiny_model, redis_url, tmp_path, client):
    model = tmp_path / "model.gguf"
    arch = with_unknown_architecture(tiny_model, model)
    env = {**bridge_env(redis_url, ENGINE_BINARY=str(engine_binary), ENGINE_MODEL=str(model)),
           "BRIDGE_ID": "main"}
    full = {**os.environ, **env}
    proc = subprocess.Popen([procs.PYTHON, str(procs.ROOT / "manage.py"), "run_bridge"], cwd=procs.ROOT, env=full)
    try:
        state = wait_state(full, lambda s: s.get("status") == "refused", 60, "status refused")
        assert f"architecture '{arch}' is not supported" in state["refused"], state
        time.sleep(3.0)   # a crash loop would have restarted it several times by now
        state = procs.bridge_state(full)
        assert state["status"] == "refused" and state["restarts"] == 0 and not state["up"], state
        r = client.get("/health")
        body = r.json()
        assert r.status_code == 503 and body["engine"] == "refused", body
        assert f"architecture '{arch}' is not supported" in body["refusal"], body
        events = asyncio.run(collect(GenerationRequest(prompt=CHATML.format("Hi"), max_tokens=2)))
        err = final(events)
        assert err["code"] == "ENGINE_UNAVAILABLE" and "refused its model file" in err["message"], err
        shutil.copyfile(tiny_model, model)      # a file the engine knows: it starts
        state = wait_state(full, lambda s: s.get("up"), 60, "the engine up on the replaced file")
        assert state["refused"] is None and state["restarts"] == 1, state
        assert client.get("/health").json()["refusal"] is None
    finally:
        procs.stop(proc)
