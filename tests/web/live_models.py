"""`two_model_stack`: the real site with two models served — Daphne, the bridge "main" on the
fixture model (tiny-moe, 2 KV slots) and the bridge "second" on another fixture model file
(tiny-moe-b: another seed, 3 layers and 6 experts, 3 KV slots), both real `run_bridge` processes
driving the native engine, on one Redis. Module-scoped: a test file that needs several models
starts its own stack (the session's `live_stack` keeps serving one model).
"""
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import procs
from tests.web.live import LiveStack, start_stack

SECOND = {"bridge": "second", "model": "tiny-moe-b", "slots": 3, "rows": 3, "cols": 6}
FIRST = {"bridge": "main", "model": "tiny-moe", "slots": 2}


@dataclass
class TwoModelStack:
    stack: LiveStack
    models: dict  # model id -> the id of the bridge serving it

    @property
    def url(self) -> str:
        return self.stack.url


def _wait_for_bridges(url: str, want: set[str], timeout: float = 60.0) -> dict:
    """/health once every bridge in `want` is listed up; its answer."""
    deadline, body = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        body = httpx.get(url + "/health", timeout=5).json()
        if {b["id"] for b in body.get("bridges", []) if b["status"] == "up"} >= want:
            return body
        time.sleep(0.2)
    raise TimeoutError(f"bridges {sorted(want)} not all up within {timeout}s: {body}")


@pytest.fixture(scope="module")
def two_model_stack(django_db_setup, django_db_blocker, engine_binary, tiny_model,
                    tmp_path_factory) -> Iterator[TwoModelStack]:
    second_model = procs.make_tiny_model(Path(tmp_path_factory.mktemp("models-b")) / f"{SECOND['model']}.gguf",
                                         "--seed", "7", "--layers", str(SECOND["rows"]),
                                         "--experts", str(SECOND["cols"]))
    engines = {"ENGINE_BINARY": str(engine_binary), "ENGINE_MODEL": str(tiny_model)}
    with start_stack(django_db_blocker, tmp_path_factory, engines) as stack:
        second = procs.start_bridge({**stack.env, "BRIDGE_ID": SECOND["bridge"], "ENGINE_MODEL": str(second_model),
                                     "KV_SLOTS": str(SECOND["slots"])}, timeout=120)
        try:
            _wait_for_bridges(stack.url, {FIRST["bridge"], SECOND["bridge"]})
            yield TwoModelStack(stack, {FIRST["model"]: FIRST["bridge"], SECOND["model"]: SECOND["bridge"]})
        finally:
            procs.stop(second)
