"""Every architecture through the mux protocol (issue 15 item 4): MODEL names it, EMAP/HITS/ROUTES
have one row per MoE block (GLM's leading dense block and MTP block excluded), experts read from
disk (EXPERT_RAM_MB=0) give the same tokens as experts in RAM, and a slot file saved by one
engine is resumed by the next (KVSAVE=1)."""
from __future__ import annotations


import pytest

from tests.native.engine import SCALE, chatml, parse_map, parse_model_line
from tests.support import procs

pytestmark = pytest.mark.timeout(int(120 * SCALE))

# arch -> (MoE rows, experts)
ARCHS = {"qwen3moe": (2, 8), "olmoe": (2, 8), "qwen2moe": (2, 8), "granitemoe": (2, 8), "glm4moe": (2, 8)}
PROMPT = chatml("Tell me about rivers.")


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    out = {}
    for arch in ARCHS:
        out[arch] = d / f"{arch}.gguf"
        procs.make_arch_fixture(out[arch], arch)
    return out


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_architecture_through_the_protocol(arch, arch_models, spawn, tmp_path):
    rows, cols = ARCHS[arch]
    e = spawn(model=str(arch_models[arch]), slots=2, KVSAVE="1", KV_DIR=str(tmp_path))
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    m = parse_model_line(e.latest["MODEL"])
    assert m["arch"] == arch and m["n_experts"] == cols and m["chat_template"], m
    r = e.result(e.submit(PROMPT, slot=0, max_tokens=16, extra=" routes=1"))
    assert r.done is not None, r.errors
    assert parse_map(r.block_line("EMAP"), "EMAP")[:2] == (rows, cols)
    p = r.block_line("ROUTES").split(" ")
    assert (int(p[2]), int(p[3])) == (rows, cols) and len(p) > 4, r.block_line("ROUTES")
    e.close()
    disk = spawn(model=str(arch_models[arch]), slots=2, EXPERT_RAM_MB="0", KVSAVE="1", KV_DIR=str(tmp_path))
    again = disk.result(disk.submit(PROMPT, slot=0, max_tokens=16))
    assert again.text == r.text, "experts read from disk gave other tokens than experts in RAM"
    assert again.reused == again.prompt_tokens - 1, f"slot file not resumed: {again.accept}"
