"""Fixtures for the native engine protocol suite.

The engine binary is built once per session (`make -C native`, from tests/conftest.py) unless
COLIBRI_ENGINE names another binary, e.g. the sanitizer build:

    make -C native asan
    ASAN_OPTIONS=detect_leaks=0 COLIBRI_ENGINE=$PWD/native/build-asan/colibri-engine \
        .venv/bin/pytest tests/native

(detect_leaks=0: libgomp keeps thread pools alive at exit, which LeakSanitizer reports as noise.)
Deadlines scale with COLIBRI_TEST_TIMEOUT_SCALE (default 4 for build-asan binaries, else 1).
"""
from __future__ import annotations

import subprocess

import pytest

from tests.native.engine import ROOT, Engine, EngineError, base_env
from tests.support import procs


@pytest.fixture(scope="session")
def engine_bin(engine_binary):
    b = engine_binary
    if not b.exists() and "build-asan" in str(b):
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "asan"], check=True)
    assert b.exists(), f"engine binary {b} missing (make -C native failed?)"
    return b


@pytest.fixture(scope="session")
def models(tmp_path_factory, tiny_model):
    """Fixture GGUFs: default tiny MoE (4 layers x 8 experts, top-2), a bigger one for the
    disk tier (8 x 16), a shared-expert/unit-gating one and a dense one."""
    d = tmp_path_factory.mktemp("native-models")
    return {
        "moe": tiny_model,
        "big": procs.make_tiny_model(d / "big.gguf", "--layers", "8", "--experts", "16"),
        "shexp": procs.make_tiny_model(d / "shexp.gguf", "--shared-expert", "--gating", "unit"),
        "dense": procs.make_tiny_model(d / "dense.gguf", "--dense"),
        "endless": procs.make_tiny_model(d / "endless.gguf", "--mute-eos"),
    }


@pytest.fixture
def spawn(engine_bin, models, tmp_path):
    """spawn(model="moe", slots=4, ctx=512, wait_ready=True, args=(), **env) -> Engine.
    Every engine started here is checked for sanitizer reports and killed at teardown."""
    started: list[Engine] = []

    def _spawn(model="moe", slots=4, ctx=512, wait_ready=True, args=(), **env):
        path = models[model] if model in models else model
        env.setdefault("COLI_USAGE", str(tmp_path / f"usage-{len(started)}"))
        e = Engine(engine_bin, env=base_env(path, slots, ctx, **env), args=args, wait_ready=wait_ready)
        started.append(e)
        return e

    yield _spawn
    errors = []
    for e in started:
        if e.proc.poll() is None:
            e.close_stdin()
            try:
                e.proc.wait(5)
            except subprocess.TimeoutExpired:
                e.kill()
        e.kill()
        try:
            e.check_clean()
        except EngineError as ex:
            errors.append(str(ex))
    if errors:
        pytest.fail("\n".join(errors))


class _Shared:
    engine: Engine | None = None


@pytest.fixture(scope="module")
def _shared(engine_bin, models, tmp_path_factory):
    holder = _Shared()
    usage = tmp_path_factory.mktemp("shared") / "usage"

    def start():
        holder.engine = Engine(engine_bin, env=base_env(models["moe"], 16, 512, COLI_USAGE=usage))

    holder.start = start
    yield holder
    e = holder.engine
    if e is not None:
        rc = None
        try:
            rc = e.close()
        finally:
            e.kill()
        e.check_clean()
        assert rc == 0, f"shared engine exited with {rc} after EOF"


@pytest.fixture
def eng(_shared):
    """A shared engine (16 slots, CTX 512, default tiny MoE) for independent tests. Respawned
    if a previous test killed it; leftover requests are stopped after each test."""
    e = _shared.engine
    if e is None or e.proc.poll() is not None or e.eof:
        if e is not None:
            e.kill()
            e.check_clean()
        _shared.start()
        e = _shared.engine
    yield e
    try:
        for rid in e.active():
            e.stop(rid)
        e.wait(lambda: not e.active(), 10, "leftover requests to finish")
        e.check_clean()
    except (EngineError, OSError):
        e.kill()
        _shared.engine = None
        raise
