"""Every MoE architecture of native/tools/make_arch_fixture.py through the mux protocol (issue 15
item 4): the MODEL line names the architecture and carries the file's chat template; one turn
(SUBMIT -> ACCEPT -> DATA ... -> DONE) with its telemetry block, EMAP/HITS sized by the file's
MoE layers x experts; the same greedy text with most experts left on disk (EXPERT_RAM_MB=1: the
expert store's tiers work for the architecture); the usage file saved by one engine gives the
next its heat; a file missing a key or tensor the architecture needs is refused before READY with
one line naming it.

The forward's arithmetic is checked against float64 references in tests/model/test_arch_oracle.py;
this file checks the serving side. Architectures the fixture generator knows but the engine does
not load yet are skipped, each with the engine's refusal as the reason; those in LANDED must load.
"""
from __future__ import annotations

import importlib.util
import math
import struct

import pytest
from gguf import GGUFReader

from tests.model.arch_ref import gguf_field
from tests.native.engine import SCALE, T, chatml, hits_bits, parse_map, parse_model_line, parse_tiers
from tests.native.test_mux import check_block, check_done
from tests.support import procs
from tests.support.procs import ROOT

pytestmark = pytest.mark.timeout(int(180 * SCALE))

GEN = ROOT / "native" / "tools" / "make_arch_fixture.py"
_spec = importlib.util.spec_from_file_location("make_arch_fixture", GEN)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
ARCHS = _mod.ARCHS

# Architectures whose arch_<name>.c is registered: these must load (never skipped).
LANDED = {"qwen3moe", "olmoe", "qwen2moe", "granitemoe", "glm4moe"}
# Per architecture, a tensor of its own layout the engine must refuse to run without (others:
# output_norm.weight, which every architecture needs).
REQUIRED_TENSOR = {
    "qwen3moe": "blk.0.attn_q_norm.weight",
    "olmoe": "blk.0.attn_k_norm.weight",
    "qwen2moe": "blk.0.ffn_gate_inp_shexp.weight",
}
PROMPT = chatml("What is the capital of France?")
MAX_TOKENS = 16


def _fixture(tmp_path_factory, arch):
    d = tmp_path_factory.getbasetemp() / "arch-fixtures"
    d.mkdir(exist_ok=True)
    path = d / f"{arch}.gguf"
    if not path.exists():
        procs.make_arch_fixture(path, arch)
    return path


def _layout(path):
    """(MoE layer count, experts, top-k, chat template) as the file states them."""
    r = GGUFReader(str(path))

    def field(key, default=None):
        return gguf_field(r, key, default)

    arch = field("general.architecture")
    # MoE blocks of the forward: GLM's trailing nextn_predict_layers (MTP) blocks are not run
    n_run = int(field(f"{arch}.block_count")) - int(field(f"{arch}.nextn_predict_layers", 0))
    moe_rows = sum(1 for t in r.tensors if t.name.endswith(".ffn_gate_inp.weight") and int(t.name.split(".")[1]) < n_run)
    return moe_rows, int(field(f"{arch}.expert_count")), int(field(f"{arch}.expert_used_count")), \
        field("tokenizer.chat_template")


def _start(spawn, path, arch, **env):
    """An engine on path, or a skip when the engine refuses the architecture itself (not landed)."""
    e = spawn(model=path, slots=2, wait_ready=False, **env)
    e.wait(lambda: e.ready or e.proc.poll() is not None, T, "READY or exit")
    if not e.ready:
        e.wait_exit(T)
        err = e.stderr_text().strip()
        last = err.splitlines()[-1] if err else ""
        if arch not in LANDED and f"architecture '{arch}' is not supported" in last:
            pytest.skip(f"{arch}: not loaded by the engine yet ({last})")
        pytest.fail(f"{arch}: the engine refused its fixture: {err[-600:]}")
    e.wait(lambda: "MODEL" in e.latest and "EMAP" in e.latest, what="MODEL and EMAP lines")
    return e


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_arch_serves_one_turn(arch, spawn, tmp_path_factory):
    path = _fixture(tmp_path_factory, arch)
    rows, cols, top_k, template = _layout(path)
    e = _start(spawn, path, arch)
    info = parse_model_line(e.latest["MODEL"])
    assert info["arch"] == arch, info
    assert template and info["chat_template"] == template, info
    assert (info["n_experts"], info["top_k"]) == (cols, top_k), info

    r = e.generate(PROMPT, slot=0, max_tokens=MAX_TOKENS)
    assert r.done is not None, f"{arch}: {r.errors} {e.stderr_text()[-400:]}"
    assert r.done[0] == "STAT"
    check_done(r, MAX_TOKENS)
    assert r.stat()["emitted"] >= 1 and r.data, f"{arch}: no DATA"
    check_block(r, rows=rows, cols=cols)
    # every MoE layer routed at least top-k distinct experts over the turn, and each of them
    # shows heat in EMAP
    emap = parse_map(r.block_line("EMAP"), "EMAP")[2]
    union = [0] * (rows * cols)
    for ln in (x for x in r.block if x.startswith("HITS ")):
        for i, bit in enumerate(hits_bits(parse_map(ln, "HITS")[2], rows * cols)):
            union[i] |= bit
    for row in range(rows):
        assert sum(union[row * cols:(row + 1) * cols]) >= top_k, f"{arch} row {row}: {union}"
    for i, bit in enumerate(union):
        assert not bit or emap[i] & 63 > 0, f"{arch}: expert {divmod(i, cols)} in HITS, heat 0 in EMAP"
    # greedy is deterministic across slots
    again = e.generate(PROMPT, slot=1, max_tokens=MAX_TOKENS)
    assert again.text == r.text, f"{arch}: greedy differs between slots"
    assert e.close() == 0


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_arch_experts_from_disk(arch, spawn, tmp_path_factory):
    """EXPERT_RAM_MB=1 keeps part of the experts on disk (read on use): the same greedy text."""
    path = _fixture(tmp_path_factory, arch)
    rows, cols, _, _ = _layout(path)
    ram = _start(spawn, path, arch)
    want = ram.generate(PROMPT, slot=0, max_tokens=MAX_TOKENS)
    assert want.done is not None, want.errors
    ram.close()
    e = _start(spawn, path, arch, EXPERT_RAM_MB=1, PIN_MB=0)
    vr, in_ram, disk, _, _ = parse_tiers(e.latest["TIERS"])
    assert disk > 0 and vr + in_ram + disk == rows * cols, f"{arch}: {e.latest['TIERS']}"
    got = e.generate(PROMPT, slot=0, max_tokens=MAX_TOKENS)
    assert got.done is not None, got.errors
    assert got.text == want.text, f"{arch}: experts read from disk change the output"
    assert got.stat()["hit_pct"] < 100.0 or math.isnan(got.stat()["hit_pct"]), got.done
    assert e.close() == 0


def _rename(data: bytearray, old: bytes, new: bytes):
    """Renames a GGUF key or tensor in place (same length: the offsets stay valid)."""
    assert len(old) == len(new)
    i = data.find(struct.pack("<Q", len(old)) + old)
    assert i >= 0, old
    data[i + 8:i + 8 + len(old)] = new


def _refusal(spawn, src, dst, old, new):
    data = bytearray(src.read_bytes())
    _rename(data, old, new)
    dst.write_bytes(bytes(data))
    e = spawn(model=dst, wait_ready=False)
    rc = e.wait_exit(T)
    err = e.stderr_text().strip()
    assert not e.ready and rc == 3, f"{old!r} renamed: rc {rc}, stderr {err[-400:]}"
    lines = err.splitlines()
    assert lines and 0 < len(lines[-1]) <= 400, err
    return lines[-1]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_arch_refuses_a_file_it_cannot_run(arch, spawn, tmp_path_factory, tmp_path):
    path = _fixture(tmp_path_factory, arch)
    _start(spawn, path, arch).close()     # loads as written (skips an architecture not landed yet)
    tensor = REQUIRED_TENSOR.get(arch, "output_norm.weight")
    name = tensor.encode()
    last = _refusal(spawn, path, tmp_path / "no-tensor.gguf", name, name.replace(b".weight", b".weighX"))
    assert tensor in last, f"{arch}: refusal does not name the tensor: {last!r}"
    key = f"{arch}.expert_count".encode()
    last = _refusal(spawn, path, tmp_path / "no-key.gguf", key, key.replace(b"count", b"cXunt"))
    assert key.decode() in last, f"{arch}: refusal does not name the key: {last!r}"


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_arch_usage_file_persists(arch, spawn, tmp_path_factory, tmp_path):
    """The expert usage history (.coli_usage) of an architecture's file: saved at the turn's end,
    loaded by the next engine, whose EMAP starts with the heat the first one ended with."""
    path = _fixture(tmp_path_factory, arch)
    usage = tmp_path / "usage"
    e = _start(spawn, path, arch, USAGE_SAVE=1, COLI_USAGE=usage)
    fresh = parse_map(e.latest["EMAP"], "EMAP")[2]
    r = e.generate(PROMPT, slot=0, max_tokens=MAX_TOKENS)
    assert r.done is not None, r.errors
    ended = parse_map(r.block_line("EMAP"), "EMAP")[2]
    assert e.close() == 0
    assert usage.exists() and usage.stat().st_size > 0, f"{arch}: no usage file written"
    assert any(b & 63 > a & 63 for a, b in zip(fresh, ended)), f"{arch}: the turn added no heat"
    again = _start(spawn, path, arch, USAGE_SAVE=0, COLI_USAGE=usage)
    loaded = parse_map(again.latest["EMAP"], "EMAP")[2]
    assert [b & 63 for b in loaded] == [b & 63 for b in ended], f"{arch}: usage file not loaded"
    assert again.close() == 0
