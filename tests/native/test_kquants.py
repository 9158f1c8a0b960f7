"""K-quant, Q5_0/Q5_1, IQ4_NL/IQ4_XS and BF16 dequantization: the engine's dequant_row (the values its EXACT mode and
its kernels' weights are) equals gguf's numpy dequantizers bit for bit, on random blocks (random
codes and scales, finite fp16 d/dmin) and on blocks with extreme scales."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from tests.native.engine import ROOT

# ggml type -> (block bytes, offsets of fp16 fields)
LAYOUT = {
    T.Q2_K: (84, (80, 82)),
    T.Q3_K: (110, (108,)),
    T.Q4_K: (144, (0, 2)),
    T.Q5_K: (176, (0, 2)),
    T.Q6_K: (210, (208,)),
    T.Q5_0: (22, (0,)),         # blocks of 32: f16 d, u32 qh, 16 nibble bytes
    T.Q5_1: (24, (0, 2)),       # f16 d, f16 m, u32 qh, 16 nibble bytes
    T.IQ4_NL: (18, (0,)),       # blocks of 32: f16 d, 16 bytes of codes into the int8 table
    T.IQ4_XS: (136, (0,)),      # f16 d, u16 scales_h, u8 scales_l[4], 128 bytes of codes
}
BLOCK_VALUES = {T.Q5_0: 32, T.Q5_1: 32, T.IQ4_NL: 32}   # others: 256


@pytest.fixture(scope="module")
def deq_dump():
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/deq_dump"], check=True)
    return ROOT / "native" / "build" / "deq_dump"


def engine_dequant(deq_dump, tmp_path, qtype, raw: np.ndarray, n: int) -> np.ndarray:
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(raw.tobytes())
    subprocess.run([str(deq_dump), str(int(qtype)), str(n), str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.float32).reshape(-1, n)


def random_blocks(rng, qtype, n_blocks, extreme=False):
    size, f16_at = LAYOUT[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in f16_at:
        if extreme:   # the largest finite fp16 magnitudes, negative ones, subnormals, zero
            vals = rng.choice(np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1.0, -0.5], dtype=np.float16), n_blocks)
        else:
            vals = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)
        b[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    return b


@pytest.mark.parametrize("qtype", list(LAYOUT), ids=lambda t: t.name)
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "extreme"])
def test_k_quant_dequant_is_bit_exact(deq_dump, tmp_path, qtype, extreme):
    rng = np.random.default_rng(int(qtype) * 7 + extreme)
    bv = BLOCK_VALUES.get(qtype, 256)
    rows, per_row = 24, 1024 // bv             # rows of 1024 values
    raw = random_blocks(rng, qtype, rows * per_row, extreme).reshape(rows, -1)
    want = dequantize(raw, qtype).astype(np.float32)
    got = engine_dequant(deq_dump, tmp_path, qtype, raw, bv * per_row)
    assert want.shape == got.shape
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), (
        f"{qtype.name}: {np.sum(want.view(np.uint32) != got.view(np.uint32))} values differ")


def test_bf16_dequant_is_bit_exact(deq_dump, tmp_path):
    rng = np.random.default_rng(30)
    x = np.concatenate([rng.standard_normal(4000).astype(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, 3e38, -1e-40, 1e-45], dtype=np.float32)])
    x = np.resize(x, 16 * 256).reshape(16, 256)
    raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    want = dequantize(raw, T.BF16).astype(np.float32)
    got = engine_dequant(deq_dump, tmp_path, T.BF16, raw, 256)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
