"""The engine's one memory budget: sized from its cgroup's limit when none is given, split between
the dense weights, every slot's KV, the working buffers and the expert cache, refused at start
when the dense part and one slot's KV do not fit, and never passed, whatever the prompt or the
number of slots.

The capped runs put the engine in a real cgroup v1 memory controller child (created here, as
root); they skip, saying why, where the controller is not mounted or not writable."""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.native.engine import ASAN, Engine, base_env, chatml, parse_tiers
from tests.support import procs

CGROOT = Path("/sys/fs/cgroup/memory")
MIB = 1 << 20
CTX = 2200
MAX_TOKENS = 8
POS_BYTES = 8 * 2 * 64 * 2 + 4      # one KV position of the wide model: 8 layers x K and V x 64 fp16 + its token id


def _need_cgroup_v1() -> None:
    if ASAN:
        pytest.skip("a sanitizer build's shadow memory and quarantine are outside any budget")
    if not (CGROOT / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory controller mounted at {CGROOT}")
    if not os.access(CGROOT, os.W_OK):
        pytest.skip(f"{CGROOT} is not writable (the capped runs create a child cgroup; run as root)")


@contextlib.contextmanager
def cgroup(name: str, limit: int | None, parent: Path = CGROOT) -> Iterator[Path]:
    """A child memory cgroup with `limit` bytes (None: no limit of its own), removed after."""
    cg = parent / f"{name}-{os.getpid()}"
    cg.mkdir()
    try:
        if limit is not None:
            (cg / "memory.limit_in_bytes").write_text(str(limit))
        yield cg
    finally:
        for _ in range(50):         # its processes must have left: the engine's exit is reaped
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    """A busy loop on every core beside the engine, so the capped runs meet the timings of a busy
    machine (reads landing late, the lookahead's guesses and the I/O lanes out of step with the
    forward) and not only those of a quiet one."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def capped_engine(binary: Path, cg: Path, model: Path, slots: int, **env: object) -> Engine:
    """An engine started inside cgroup cg: a shell moves itself in, then execs the engine (same pid)."""
    script = f'echo $$ > {cg}/cgroup.procs && exec "$0"'
    return Engine("/bin/sh", env=base_env(model, slots, CTX, **env), args=["-c", script, str(binary)])


def memory_split(e: Engine) -> dict:
    """The MODEL line's `memory` object (the handshake's last line, after READY)."""
    e.wait(lambda: "MODEL" in e.latest, what="the MODEL line")
    return json.loads(e.latest["MODEL"][len("MODEL "):])["memory"]


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """8 layers x 256 experts (top-2): ~70 MB of experts, the engine's whole footprint ~90 MB; EOS
    muted, so a turn lasts its max_tokens."""
    d = tmp_path_factory.mktemp("budget-model")
    return procs.make_tiny_model(d / "wide.gguf", "--layers", "8", "--experts", "256", "--mute-eos")


def prompt(sentences: int) -> str:
    return chatml(" ".join(f"The quick brown fox jumps over the lazy dog number {i}." for i in range(sentences)))


# ~50, ~500, ~1,000 and ~2,000 tokens on the fixture's tokenizer
PROMPTS = [prompt(1), prompt(17), prompt(34), prompt(69)]


@pytest.fixture(scope="module")
def reference(engine_bin, wide_model) -> dict[str, tuple[int, bytes]]:
    """Each prompt's token count and greedy text from an engine without a cap (every expert in RAM).
    Every test that uses it skips under a sanitizer, so it does too, before a ~2,000-token prefill
    at ASan's pace."""
    if ASAN:
        pytest.skip("its tests measure memory, which a sanitizer build's shadow memory inflates")
    e = Engine(engine_bin, env=base_env(wide_model, 1, CTX, USAGE_SAVE="0", USAGE_FILE="/dev/null"))
    try:
        mem = memory_split(e)
        assert mem["experts_resident"] and mem["experts_borrowable_mb"] == 0, mem
        out = {}
        for p in PROMPTS:
            r = e.generate(p, max_tokens=MAX_TOKENS)
            out[p] = (r.prompt_tokens, r.text)
        assert e.close() == 0
    finally:
        e.kill()
    counts = [out[p][0] for p in PROMPTS]
    assert 40 <= counts[0] <= 80 and 1800 <= counts[-1] <= CTX - 2, counts
    return out


def peak_within(cg: Path, mem: dict) -> int:
    peak = int((cg / "memory.max_usage_in_bytes").read_text())
    limit = int((cg / "memory.limit_in_bytes").read_text())
    assert peak <= limit
    assert peak <= mem["budget_mb"] * MIB * 1.03, (peak / MIB, mem)
    return peak


def probe_split(engine_bin: Path, wide_model: Path, slots: int, env: dict[str, str]) -> dict:
    """The memory split of an engine with a 16 MB budget, started and closed (what the dense part
    and the working buffers take, to size a test's budget from). Skips under a sanitizer."""
    if ASAN:
        pytest.skip("a sanitizer build's shadow memory is measured in the dense part: 16 MB cannot hold it")
    probe = Engine(engine_bin, env=base_env(wide_model, slots, CTX, MEM_BUDGET_MB="16", **env))
    try:
        mem = memory_split(probe)
        assert probe.close() == 0
    finally:
        probe.kill()
    return mem


@pytest.mark.parametrize("slots", [1, 4])
def test_a_capped_engine_serves_long_prompts_within_its_cgroup(engine_bin, wide_model, reference, slots):
    """Under a 48 MiB cap (about half of what the engine takes with every expert in RAM), prompts
    of ~50 to ~2,000 tokens, one at a time in one slot or all at once in four, end with the
    uncapped engine's greedy text, the engine exits 0, and the cgroup's peak stays within the
    budget it sized itself to (the limit less its margin) plus 3 %, with every core kept busy
    beside it."""
    _need_cgroup_v1()
    limit = 48 * MIB
    with cgroup("colibri-budget", limit) as cg, cpu_hog():
        e = capped_engine(engine_bin, cg, wide_model, slots, USAGE_SAVE="0", USAGE_FILE="/dev/null")
        try:
            mem = memory_split(e)
            assert mem["source"] == "cgroup" and not mem["experts_resident"], mem
            assert mem["experts_mb"] < mem["experts_all_mb"] / 2, mem       # the cap bites
            if slots == 1:
                texts = [e.generate(p, max_tokens=MAX_TOKENS, timeout=60) for p in PROMPTS]
            else:
                rids = [e.submit(p, slot=s, max_tokens=MAX_TOKENS) for s, p in enumerate(PROMPTS)]
                texts = [e.result(rid, timeout=90) for rid in rids]
            for p, r in zip(PROMPTS, texts):
                assert r.done is not None, (r.errors, e.stderr_text()[-2000:])
                assert (r.prompt_tokens, r.text) == reference[p]
            assert e.close(30) == 0
        finally:
            e.kill()
        peak_within(cg, mem)
        oom = (cg / "memory.oom_control").read_text()
        assert "oom_kill 0" in oom or "oom_kill" not in oom, oom


def test_it_sizes_itself_from_the_cgroup_limit(engine_bin, wide_model):
    """No figure given: the limit of the engine's cgroup's parent (the child has none of its own)
    less the documented margin (5 %, at least 16 MiB) is the budget, and the split adds up to it."""
    _need_cgroup_v1()
    limit = 64 * MIB
    with cgroup("colibri-budget-parent", limit) as parent, cgroup("child", None, parent) as cg:
        e = capped_engine(engine_bin, cg, wide_model, 2, USAGE_SAVE="0", USAGE_FILE="/dev/null")
        try:
            mem = memory_split(e)
            assert e.close() == 0
        finally:
            e.kill()
    margin = max(limit / 20, 16 * MIB)
    assert mem["source"] == "cgroup", mem
    assert mem["limit_mb"] == pytest.approx(limit / MIB, abs=0.05), mem
    assert mem["margin_mb"] == pytest.approx(margin / MIB, abs=0.05), mem
    assert mem["budget_mb"] == pytest.approx((limit - margin) / MIB, abs=0.05), mem
    # every slot's KV at its context: 2 slots x CTX positions
    assert mem["kv_mb"] == pytest.approx(2 * CTX * POS_BYTES / MIB, abs=0.05), mem
    assert mem["experts_borrowable_mb"] == pytest.approx(2 * CTX * POS_BYTES / MIB, abs=0.05), mem
    assert not mem["experts_resident"], mem     # the experts (66 MB) do not all fit: the cache is what is left
    parts = mem["dense_mb"] + mem["kv_mb"] + mem["work_mb"] + mem["experts_mb"]
    assert parts == pytest.approx(mem["budget_mb"], abs=0.3), mem


def test_a_budget_without_room_for_one_slot_is_refused_at_start(engine_bin, wide_model):
    """8 MB cannot hold the dense weights, the buffers and one slot's KV at CTX=65536 (~130 MB):
    exit 1 before READY, with the figures named."""
    e = Engine(engine_bin, env=base_env(wide_model, 1, 65536, MEM_BUDGET_MB="8", USAGE_SAVE="0"),
               wait_ready=False)
    try:
        rc = e.wait_exit()
    finally:
        e.kill()
    err = e.stderr_text()
    assert rc == 1 and not e.ready, err
    assert "memory budget 8 MB (MEM_BUDGET_MB) is too small" in err, err
    assert "one slot's KV at CTX=65536 128 MB" in err, err


def test_the_kv_share_bounds_the_slots_together(engine_bin, wide_model):
    """A budget that leaves the KV room for one slot's context but not for two long prompts. A
    long prompt beside another slot's running turn gets CONTEXT_EXCEEDED with the positions the
    share leaves it (not a kill); once that turn is over, the same prompt runs, the idle slot's
    history freed for it."""
    env = dict(USAGE_SAVE="0", USAGE_FILE="/dev/null")
    mem = probe_split(engine_bin, wide_model, 2, env)
    # ~6 MB of KV: one slot's context (4.3 MB) fits, a running 2,000-token turn (2,048 positions
    # held) and a second one (2,008) do not (7.9 MB)
    budget = math.ceil(mem["dense_mb"] + mem["work_mb"] + 6)
    e = Engine(engine_bin, env=base_env(wide_model, 2, CTX, MEM_BUDGET_MB=str(budget), **env))
    try:
        mem = memory_split(e)
        assert CTX * POS_BYTES / MIB <= mem["kv_mb"] < 4056 * POS_BYTES / MIB, mem
        busy, frame = e.submit(PROMPTS[3], slot=0, max_tokens=40, write=False)
        late, frame2 = e.submit(PROMPTS[3], slot=1, max_tokens=4, write=False)
        e.write(frame + frame2)     # slot 1's SUBMIT is read while slot 0's turn runs (40 decode steps)
        refused = e.result(late)
        n = e.result(busy).prompt_tokens
        assert refused.codes == ["CONTEXT_EXCEEDED"], (refused.errors, e.stderr_text()[-2000:])
        asked, limit = map(int, refused.errors[0][1:])
        assert asked == n and limit < n, refused.errors
        assert e.result(busy).stat()["emitted"] == 40
        again = e.generate(PROMPTS[3], slot=1, max_tokens=4)
        assert again.prompt_tokens == n
        e.wait_stderr("[KV] slot 0's history freed for slot 1")  # stderr is read by its own thread
        assert e.close() == 0
    finally:
        e.kill()


def test_the_expert_cache_borrows_the_kv_share_the_slots_do_not_use(engine_bin, wide_model, reference):
    """An expert share of ~4 MiB beside one slot's KV share (4.3 MiB): after a short prompt, with
    the KV share nearly empty, the cache holds more than its own share; after a ~2,000-token
    prompt in the same slot its experts plus the slot's KV (SLOTMEM) are within the two shares
    (what KV took was given back). Both texts are the uncapped engine's."""
    env = dict(USAGE_SAVE="0", USAGE_FILE="/dev/null")
    mem = probe_split(engine_bin, wide_model, 1, env)
    budget = math.ceil(mem["dense_mb"] + mem["work_mb"] + CTX * POS_BYTES / MIB + 4)
    e = Engine(engine_bin, env=base_env(wide_model, 1, CTX, MEM_BUDGET_MB=str(budget), **env))
    try:
        mem = memory_split(e)
        share = CTX * POS_BYTES
        assert mem["kv_mb"] == pytest.approx(share / MIB, abs=0.05), mem
        assert mem["experts_borrowable_mb"] == mem["kv_mb"] and 4 <= mem["experts_mb"] < 6, mem
        own = mem["experts_mb"] * MIB
        expert = mem["experts_all_mb"] * MIB / (8 * 256)    # the wide model: 8 MoE layers x 256 experts
        slack = 0.06 * MIB                                  # the MODEL figures' rounding (0.1 MiB)
        held = []
        for p in (PROMPTS[0], PROMPTS[3]):
            r = e.generate(p, max_tokens=MAX_TOKENS, timeout=60)
            assert (r.prompt_tokens, r.text) == reference[p]
            tiers, slotmem = r.block_line("TIERS"), r.block_line("SLOTMEM")
            assert tiers and slotmem, r.block
            _, ram, _, _, _ = parse_tiers(tiers)
            kv = int(slotmem.split()[2])
            assert ram * expert + kv <= own + share + slack, (ram, kv, mem)
            held.append((ram * expert, kv))
        assert held[0][0] > own + slack and held[0][1] < share / 8, (held, mem)   # borrowed
        assert held[1][1] > share / 2, (held, mem)                                 # and given back
        assert e.close() == 0
    finally:
        e.kill()
