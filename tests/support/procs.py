"""Helpers to run the real processes of the stack (engine fixture model, bridge worker, Daphne) in tests."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc, timeout=30.0, host="127.0.0.1"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def stop(proc, timeout=10.0):
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def build_engine(binary_env="COLIBRI_ENGINE"):
    """Builds native/ once and returns the engine binary (or the one named by $COLIBRI_ENGINE)."""
    override = os.environ.get(binary_env)
    if override:
        return Path(override).resolve()
    subprocess.run(["make", "-s", "-C", str(ROOT / "native")], check=True)
    return ROOT / "native" / "build" / "colibri-engine"


def make_tiny_model(out_path, *extra_args):
    subprocess.run(
        [PYTHON, str(ROOT / "native" / "tools" / "make_tiny_moe.py"), str(out_path), *extra_args],
        check=True,
    )
    return Path(out_path)


def make_arch_fixture(out_path, arch, *extra_args):
    """A small random model in one architecture's exact GGUF layout (native/tools/make_arch_fixture.py;
    gpt-oss: native/tools/make_tiny_gptoss.py, which takes the same --mix / --random-types / --tensor-type)."""
    if arch == "gpt-oss":
        cmd = [PYTHON, str(ROOT / "native" / "tools" / "make_tiny_gptoss.py"), str(out_path), *extra_args]
    else:
        cmd = [PYTHON, str(ROOT / "native" / "tools" / "make_arch_fixture.py"), str(out_path), "--arch", arch,
               *extra_args]
    subprocess.run(cmd, check=True)
    return Path(out_path)


def make_tiny_qwen35moe(out_path, *extra_args):
    """The tiny random Gated DeltaNet hybrid (native/tools/make_tiny_qwen35moe.py: qwen35moe, or
    qwen3next with "--arch", "qwen3next"), F32 unless extra_args say otherwise; run in this process
    (a child's import of gguf is most of a second, the file a quarter of one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tiny_qwen35moe",
                                                  ROOT / "native" / "tools" / "make_tiny_qwen35moe.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.main([str(out_path), *map(str, extra_args)])
    return Path(out_path)


def make_tiny_qwen3next(out_path, *extra_args):
    """The tiny random qwen3next file (make_tiny_qwen35moe.py --arch qwen3next), F32."""
    return make_tiny_qwen35moe(out_path, "--arch", "qwen3next", *extra_args)


def claim_redis_db(url="redis://127.0.0.1:6379", ttl=3600):
    """Claims a Redis database (1..15) for this test session so concurrent sessions do not share
    the `engine-bridge` channel; returns its redis:// URL. The claim is a key in db 0 with a TTL."""
    import redis

    admin = redis.Redis.from_url(f"{url}/0")
    try:
        for n in range(1, 16):
            if admin.set(f"colibri-test:db:{n}", os.getpid(), nx=True, ex=ttl):
                redis.Redis.from_url(f"{url}/{n}").flushdb()
                return f"{url}/{n}"
    finally:
        admin.close()
    raise RuntimeError("no free Redis database to claim for tests")


def blocked_clients(db_url):
    """Connections blocked in a pop in the Redis database of db_url. INFO's blocked_clients counts
    the whole server, which other sessions and the other pytest-xdist worker share."""
    import redis

    client = redis.Redis.from_url(db_url)
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    try:
        return sum(1 for c in client.client_list()
                   if c.get("db") == db and c.get("cmd", "").startswith(("bzpopmin", "blpop", "brpop")))
    finally:
        client.close()


def release_redis_db(db_url):
    import redis

    base, _, n = db_url.rpartition("/")
    client = redis.Redis.from_url(f"{base}/0")
    client.delete(f"colibri-test:db:{n}")
    client.close()


def bridge_state(env):
    """The bridge's telemetry (engine_bridge/telemetry.py) read straight from Redis, or None."""
    import json

    import redis

    client = redis.Redis.from_url(env.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        raw = client.get(f"{env.get('CACHE_PREFIX', os.environ.get('CACHE_PREFIX', 'colibri'))}:bridge:{env.get('BRIDGE_ID', 'main')}:state")
    finally:
        client.close()
    return json.loads(raw) if raw else None


def start_bridge(env, timeout=60.0, argv_prefix=(), root=ROOT):
    """Runs `manage.py run_bridge` with env (merged over os.environ) and waits until its telemetry
    says the engine is up. Set REDIS_URL (see claim_redis_db), ENGINE_BINARY or ENGINE_COMMAND,
    ENGINE_MODEL, KV_SLOTS, CTX; ENGINE_ENV="KVSAVE=0,USAGE_SAVE=0" keeps the engine hermetic.
    argv_prefix runs it under a launcher that execs it (`ip netns exec NS`: tests/support/netns.py);
    root: the checkout it runs from (bench/webpath.py --base)."""
    full = {**os.environ, **env}
    state_before = bridge_state(full)
    proc = subprocess.Popen([*argv_prefix, PYTHON, str(Path(root) / "manage.py"), "run_bridge"], cwd=root, env=full)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"run_bridge exited early with code {proc.returncode}")
        state = bridge_state(full)
        if state and state.get("up") and state != state_before:
            return proc
        time.sleep(0.1)
    stop(proc)
    raise TimeoutError(f"bridge did not report the engine up within {timeout}s")
