"""The engine's routing of a big-shaped test file, as the generators' tests read it: one long
prompt of random letter runs (~1,700 tokens, so every expert of a layer is picked dozens of times)
through the protocol with routes=1, and the ROUTES block's counts as a (layers x experts) matrix."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from tests.native.engine import Engine, base_env


def route_counts(engine_binary: Path, model: Path, ready_s: float, result_s: float,
                 extra: str = "") -> tuple[int, np.ndarray]:
    """(prompt tokens, selections per row and expert) of the random-letter prompt on `model`;
    `extra` adds request options beside routes=1."""
    rnd = random.Random(0)
    prompt = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ") for _ in range(3000))
    e = Engine(engine_binary, env=base_env(model, slots=1, ctx=4096), wait_ready=False)
    try:
        e.wait(lambda: e.ready, ready_s, "READY")
        r = e.result(e.submit(prompt, max_tokens=4, extra=" routes=1" + extra), timeout=result_s)
        assert r.done is not None, r.errors
    finally:
        e.close(timeout=120)
    routes = r.block_line("ROUTES")
    assert routes is not None, r.block
    line = routes.split(" ")
    counts = np.zeros((int(line[2]), int(line[3])))
    for tr in line[4:]:
        a, b, n = map(int, tr.split(":"))
        counts[a, b] = n
    return r.prompt_tokens, counts
