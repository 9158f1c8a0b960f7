"""Fixture files in the weight mixes whose experts are not plain K-quants load and answer a
protocol turn, with the same tokens whether the experts are held in RAM or read from disk:
* Q5_0 / Q5_1 expert downs, 352 wide (rows that are not a multiple of 256, as in Qwen1.5-MoE's
  and GLM-4.5-Air's Q4_K_M / Q5_K_M files);
* IQ4_XS files (llama.cpp's IQ4_XS mix: IQ4_XS with Q8_0 attention k/v, Q5_K attention output
  and a Q6_K head), and experts 352 wide whose downs it writes as IQ4_NL.
Their arithmetic against the float64 reference: tests/model/test_arch_oracle.py (the same mixes);
the IQ4 kernels: native/tests/test_quant_iq.c; dequantization: tests/native/test_kquants.py."""
from __future__ import annotations

import pytest

from tests.native.engine import SCALE, chatml, parse_model_line
from tests.support import procs

pytestmark = pytest.mark.timeout(int(120 * SCALE))

CASES = [("qwen2moe", "q4_k_m_q5_0"), ("glm4moe", "q5_k_m_q5_1"),
         ("qwen3moe", "iq4_xs"), ("qwen2moe", "iq4_xs_nl"), ("glm4moe", "iq4_xs")]


@pytest.mark.parametrize("arch,mix", CASES, ids=[f"{a}-{m}" for a, m in CASES])
def test_mix_files_through_the_protocol(arch, mix, spawn, tmp_path):
    model = tmp_path / f"{arch}-{mix}.gguf"
    procs.make_arch_fixture(model, arch, "--mix", mix)
    e = spawn(model=str(model), slots=1)
    e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
    assert parse_model_line(e.latest["MODEL"])["arch"] == arch
    prompt = chatml("Tell me about rivers.")
    r = e.result(e.submit(prompt, slot=0, max_tokens=12))
    assert r.done is not None and r.text, r.errors
    e.close()
    disk = spawn(model=str(model), slots=1, EXPERT_RAM_MB="0")
    again = disk.result(disk.submit(prompt, slot=0, max_tokens=12))
    assert again.text == r.text, "experts read from disk gave other tokens than experts in RAM"
    disk.close()
